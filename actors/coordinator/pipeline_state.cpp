// PipelineState <-> bytes (the wire archive of the messages: a size that lies is refused before
// anything is allocated), and the ledger's JSON.
#include "pipeline_state.h"

#include "troupe/runtime/envelope.h"
#include "troupe/runtime/wire.h"

namespace troupe::actors::coord {

template <class A>
void serialize(A& ar, TurnInfo& t) {
  ar(t.observation, t.reward, t.info_json, t.env_s, t.generate_s);
}

template <class A>
void save(A& ar, const Rollout::Group& g) {
  ar(g.index, g.env, g.prompt_text, g.metadata.dump(), g.seed, g.samples, g.rewards, g.correct, g.errors, g.reasons,
     g.components, g.env_version, g.messages_json, g.turns, g.more_samples);
}
template <class A>
void load(A& ar, Rollout::Group& g) {
  std::string metadata;
  ar(g.index, g.env, g.prompt_text, metadata, g.seed, g.samples, g.rewards, g.correct, g.errors, g.reasons,
     g.components, g.env_version, g.messages_json, g.turns, g.more_samples);
  g.metadata = json::parse(metadata, nullptr, false);
  if (g.metadata.is_discarded()) throw std::runtime_error("a group's metadata is not JSON");
}

template <class A>
void serialize(A& ar, Rollout& r) {
  ar(r.groups, r.policy_version, r.sample_version, r.round, r.rounds, r.seed_base, r.index0, r.part, r.parts, r.gen_s,
     r.env_s, r.idle_s, r.version_wait_s, r.retries);
}

// Format 3 appends, after the rollouts, what each group's verify reported besides its rewards: the
// infos (judge/latency_s, the trajectories' info) and its scorer requests (scorer/judge/*,
// scorer/reward_model/*), so a resumed run's rows and trajectories carry them as an uninterrupted
// run's do. Format 2 ends after the rollouts (those come back empty).
template <class A>
void save(A& ar, const PipelineState& p) {
  ar(p.format, p.max_staleness, p.async_chunks, p.in_flight_every, p.in_flight_min_lag, p.trained_steps,
     p.trained_episodes,
     static_cast<uint64_t>(p.finished.size()));
  for (const auto& [k, r] : p.finished) ar(k, r);
  if (p.format >= 3)
    for (const auto& [k, r] : p.finished)
      for (const auto& g : r.groups) ar(g.infos, g.judge_scorer, g.reward_model_scorer);
}
template <class A>
void load(A& ar, PipelineState& p) {
  uint64_t n = 0;
  ar(p.format);
  if (p.format != 2 && p.format != 3)
    throw std::runtime_error("format " + std::to_string(p.format) +
                             " (this troupe reads 2 and 3; format 1 predates per-token policy versions)");
  ar(p.max_staleness, p.async_chunks, p.in_flight_every, p.in_flight_min_lag, p.trained_steps, p.trained_episodes,
     n);
  if (n > ar.remaining()) throw std::runtime_error("claims " + std::to_string(n) + " rollouts");
  p.finished.resize(n);
  for (auto& [k, r] : p.finished) ar(k, r);
  if (p.format >= 3)
    for (auto& [k, r] : p.finished)
      for (auto& g : r.groups) ar(g.infos, g.judge_scorer, g.reward_model_scorer);
}

std::string encode_pipeline(const PipelineState& p) {
  std::string out(runtime::payload_size_of(p), '\0');
  runtime::write_payload(out.data(), out.size(), p);
  return out;
}

Result<PipelineState> decode_pipeline(const std::string& bytes, const std::string& where) {
  PipelineState p;
  try {
    runtime::WireInputArchive ar(bytes.data(), bytes.size());
    ar(p);
    if (ar.remaining() != 0) return invalid_input(where + ": " + std::to_string(ar.remaining()) + " trailing bytes");
  } catch (const std::exception& e) {
    return invalid_input(where + ": " + e.what());
  }
  return p;
}

int64_t episodes_of(const Rollout& r) {
  int64_t n = 0;
  for (const auto& g : r.groups) n += static_cast<int64_t>(g.samples.size());
  return n;
}

json ledger_json(const PipelineState& p, int num_generations) {
  json finished = json::array();
  for (const auto& [k, r] : p.finished) {
    json prompts = json::array();
    for (const auto& g : r.groups) prompts.push_back({{"index", g.index}, {"env", g.env}, {"seed", g.seed}});
    finished.push_back({{"grpo_step", k},
                        {"part", r.part},
                        {"policy_version", r.policy_version},
                        {"episodes", episodes_of(r)},
                        {"prompts", std::move(prompts)}});
  }
  return {{"trained_grpo_steps", p.trained_steps},
          {"trained_episodes", p.trained_episodes},
          {"samples_per_prompt", num_generations},
          {"finished_not_trained", std::move(finished)},
          {"dispatched_not_finished", json::array()}};
}

}  // namespace troupe::actors::coord
