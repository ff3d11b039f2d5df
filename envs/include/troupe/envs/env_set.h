// EnvSet: the clients for a run's `envs:` list, with deterministic weighted choice of which env
// serves the next prompt, plus helpers the coordinator needs around episodes: SFT examples from
// the envs' reference completions, and a trajectory pre-filled from an episode's start.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "troupe/envs/client.h"
#include "troupe/envs/trajectory.h"

namespace troupe::envs {

class EnvSet {
 public:
  // Starts every client (workers, remote processes) in order; the first failure is returned.
  static Result<std::unique_ptr<EnvSet>> create(const std::vector<EnvSpec>& specs);
  // Parses the YAML `envs:` list (as JSON) and creates the set; `where` prefixes errors.
  static Result<std::unique_ptr<EnvSet>> from_json(const json& envs_list, const std::string& where);

  size_t size() const { return clients_.size(); }
  EnvClient& client(size_t i) { return *clients_.at(i); }
  const EnvSpec& spec(size_t i) const { return specs_.at(i); }
  // Index of the env named `name`, or invalid_input listing the names.
  Result<size_t> index_of(const std::string& name) const;
  // Weighted choice from a 64-bit draw (e.g. a hash of (seed, step, prompt index)): env i is chosen
  // with probability weight_i / sum(weights). Deterministic for a given draw.
  size_t pick(uint64_t draw) const;

 private:
  std::vector<EnvSpec> specs_;
  std::vector<std::unique_ptr<EnvClient>> clients_;
  std::vector<double> cumulative_;  // cumulative normalized weights
};

struct SftExample {
  std::string prompt;      // the first observation's text
  std::string completion;  // metadata.reference_completion
  json metadata;
};

// n examples from seeds first_seed, first_seed+1, ... of `split` (reset, read the reference
// completion, release). An env without reference_completion is an invalid_input error.
Result<std::vector<SftExample>> sft_examples(EnvClient& client, Split split, uint64_t first_seed, int n);

// A trajectory with identity, seed, split and prompt filled in from an episode's start.
Trajectory begin_trajectory(const std::string& episode_id, const std::string& env_name, const EnvInfo& info,
                            uint64_t seed, Split split, const Observation& prompt);

}  // namespace troupe::envs
