// EnvSet and episode helpers. pick() maps a draw to [0,1) with the top 53 bits, so the choice is
// the same on every platform for the same draw.
#include "troupe/envs/env_set.h"

#include <chrono>

namespace troupe::envs {

Result<std::unique_ptr<EnvSet>> EnvSet::create(const std::vector<EnvSpec>& specs) {
  if (specs.empty()) return invalid_input("envs: the list is empty");
  auto set = std::unique_ptr<EnvSet>(new EnvSet());
  double total = 0;
  for (const auto& s : specs) total += s.weight;
  if (total <= 0) return invalid_input("envs: the weights sum to 0; give at least one env a positive weight");
  double acc = 0;
  for (const auto& s : specs) {
    auto c = make_env_client(s);
    if (!c.ok()) return Error{c.error().code, "envs: '" + s.name + "': " + c.error().message};
    set->clients_.push_back(std::move(c).value());
    set->specs_.push_back(s);
    acc += s.weight / total;
    set->cumulative_.push_back(acc);
  }
  set->cumulative_.back() = 1.0;
  return set;
}

Result<std::unique_ptr<EnvSet>> EnvSet::from_json(const json& envs_list, const std::string& where) {
  TROUPE_ASSIGN_OR_RETURN(auto specs, parse_env_specs(envs_list, where));
  return create(specs);
}

Result<size_t> EnvSet::index_of(const std::string& name) const {
  std::string names;
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return i;
    names += (i ? ", " : "") + specs_[i].name;
  }
  return invalid_input("no env named '" + name + "' (envs: " + names + ")");
}

size_t EnvSet::pick(uint64_t draw) const {
  double u = static_cast<double>(draw >> 11) * (1.0 / 9007199254740992.0);
  for (size_t i = 0; i < cumulative_.size(); ++i) {
    if (u < cumulative_[i] && specs_[i].weight > 0) return i;
  }
  for (size_t i = cumulative_.size(); i-- > 0;) {
    if (specs_[i].weight > 0) return i;
  }
  return 0;
}

Result<std::vector<SftExample>> sft_examples(EnvClient& client, Split split, uint64_t first_seed, int n) {
  std::vector<SftExample> out;
  ResetOptions opts;
  opts.split = split;
  for (int i = 0; i < n; ++i) {
    const std::string id = "sft-" + std::to_string(first_seed + static_cast<uint64_t>(i));
    EpisodeGuard guard(client, id);
    TROUPE_ASSIGN_OR_RETURN(auto obs, client.reset(id, first_seed + static_cast<uint64_t>(i), opts));
    auto ref = obs.metadata.find("reference_completion");
    if (ref == obs.metadata.end() || !ref->is_string())
      return invalid_input("env " + client.info().name + " gives no metadata.reference_completion, so it cannot make SFT data");
    out.push_back({obs.text, ref->get<std::string>(), obs.metadata});
  }
  return out;
}

Trajectory begin_trajectory(const std::string& episode_id, const std::string& env_name, const EnvInfo& info,
                            uint64_t seed, Split split, const Observation& prompt) {
  Trajectory t;
  t.episode_id = episode_id;
  t.env_name = env_name;
  t.env_version = info.version;
  t.seed = seed;
  t.split = split;
  t.prompt = prompt;
  t.start_unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return t;
}

}  // namespace troupe::envs
