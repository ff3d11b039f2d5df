// The standard trajectory record, the same for every env (schema: envs/TRAJECTORY.md), and the
// JSONL writer for RUN_DIR/trajectories/*.jsonl. The env actor fills prompt, turn texts, tool calls,
// rewards and termination; the coordinator/generator fills tokens, log-probs and policy versions.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/envs/env.h"

namespace troupe::envs {

inline constexpr const char* kTrajectorySchema = "troupe.trajectory/1";

// Why an episode ended.
enum class Termination {
  done,         // the env said done (answered, solved)
  max_turns,    // the env's or the run's turn limit
  truncated,    // the generator hit max tokens / context
  env_error,    // the env returned an error (bad input, exception)
  timeout,      // an env call ran past its deadline
  worker_crash, // the env worker process died (signal, exit)
  aborted,      // the run stopped the episode (shutdown, staleness)
  protocol_error,  // the env's reply was malformed (not JSON, wrong id, extra frames, bad UTF-8)
  invalid_reward,  // a reward that is not finite or lies outside envs[].reward_min/reward_max
  reward_timeout,     // a reward hook (dataset `verifier: python`) ran past reward_timeout_s
  reward_crash,       // a reward hook's worker process died (or answered garbage)
  reward_error,       // a reward hook's function raised
  reward_bad_return,  // a reward hook's function returned something else than a number or a dict of numbers
  judge_http,     // a dataset env's judge (config.judge): no connection, or a non-2xx answer
  judge_timeout,  // a judge call ran past judge.timeout_s
  judge_parse,    // a judge's reply held no score (pattern, field), or one outside judge.range
};
const char* termination_name(Termination t);
Result<Termination> parse_termination(const std::string& s);

struct TurnRecord {
  // Model side (filled by the generator / coordinator).
  std::vector<int32_t> prompt_tokens;      // tokens fed for this turn (may be only the new ones)
  std::vector<int32_t> completion_tokens;  // sampled tokens
  std::vector<float> logprobs;             // one per completion token, under the sampling policy
  // MoE policies: (completion_tokens x routing width) the sampler's top-k expert ids of every MoE
  // layer for each completion token (what routing replay trains with); empty otherwise.
  std::vector<int32_t> experts;
  int64_t policy_version = -1;
  std::string completion;                  // decoded completion text
  bool truncated = false;
  // Env side.
  std::string observation;                 // what the env showed before this turn (prompt or feedback)
  std::vector<ToolCall> tool_calls;        // calls parsed from the completion, with results
  double reward = 0;                       // step reward
  json info = json::object();
  double generate_s = 0, env_s = 0;        // wall time of sampling and of the env call
};

struct Trajectory {
  std::string episode_id;
  std::string env_name, env_version;
  uint64_t seed = 0;
  Split split = Split::train;
  int64_t step = -1;         // training step that consumed it (-1: not yet)
  int64_t group = -1;        // GRPO prompt group id (-1: none)
  Observation prompt;        // first observation (text, messages, metadata incl. ground truth)
  std::vector<TurnRecord> turns;
  double reward = 0;         // aggregate episode reward used for training
  std::map<std::string, double> reward_components;
  Termination termination = Termination::done;
  std::string error;         // set when termination is env_error / timeout / worker_crash
  double reset_s = 0, total_s = 0;
  double start_unix_s = 0;   // wall-clock start (seconds since the epoch)
  json extra = json::object();  // anything else (advantage, sampler settings); written as "extra"
};

json to_json(const Trajectory& t);
Result<Trajectory> trajectory_from_json(const json& j, const std::string& where);

// Appends one JSON object per line. write() flushes, so a crash loses at most the line in flight.
class TrajectoryWriter {
 public:
  // Creates parent directories; appends to an existing file.
  static Result<std::unique_ptr<TrajectoryWriter>> open(const std::string& path);
  ~TrajectoryWriter();
  TrajectoryWriter(const TrajectoryWriter&) = delete;
  TrajectoryWriter& operator=(const TrajectoryWriter&) = delete;
  Status write(const Trajectory& t);
  const std::string& path() const { return path_; }

 private:
  TrajectoryWriter(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::FILE* f_;
  std::string path_;
};

// Reads a whole trajectories JSONL file (tests, tools); errors name FILE:LINE.
Result<std::vector<Trajectory>> read_trajectories(const std::string& path);

}  // namespace troupe::envs
