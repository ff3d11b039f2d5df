// logger.trajectories: the first logger.trajectories_per_step samples of each GRPO step, one
// Trajectory row each (prompt, tokens, log-probs, reward, advantage, how it ended), appended to
// run_dir/trajectories/grpo.jsonl.
#include <algorithm>
#include <chrono>

#include "coordinator_internal.h"
#include "troupe/envs/trajectory.h"

namespace troupe::actors::coord {

void write_trajectories(const RunSetup& s, const Rollout& r, const std::vector<float>& adv, int64_t step) {
  const int G = s.cfg.rollout.num_generations;
  const int per_step = s.cfg.logger.trajectories_per_step;
  if (!s.cfg.logger.trajectories || per_step <= 0) return;
  auto w = envs::TrajectoryWriter::open(s.run_dir + "/trajectories/grpo.jsonl");
  if (!w.ok()) return;
  int written = 0;
  const double now_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (size_t gi = 0; gi < r.groups.size() && written < per_step; ++gi) {
    auto& g = r.groups[gi];
    for (int j = 0; j < G && written < per_step; ++j, ++written) {
      envs::Trajectory t;
      t.episode_id = "grpo-" + std::to_string(step) + "-" + std::to_string(gi) + "-" + std::to_string(j);
      t.env_name = g.env;
      t.env_version = g.env_version;
      t.seed = g.seed;
      t.step = step;
      t.group = static_cast<int64_t>(gi);
      t.prompt.text = g.prompt_text;
      t.prompt.metadata = g.metadata;
      if (json m = json::parse(g.messages_json, nullptr, false); m.is_array())
        for (const auto& msg : m)
          if (msg.is_object())
            t.prompt.messages.push_back({msg.value("role", std::string()), msg.value("content", std::string())});
      if (t.prompt.messages.empty() && !g.prompt_text.empty()) t.prompt.messages.push_back({"user", g.prompt_text});
      const std::vector<TurnInfo>* env_turns = j < static_cast<int>(g.turns.size()) ? &g.turns[j] : nullptr;
      const GenSample& x = g.samples[j];
      // multi-turn: one Turn per trained turn, holding the tokens appended in that turn
      const size_t turns = std::max<size_t>(1, x.turn_starts.size());
      for (size_t u = 0; u < turns; ++u) {
        // (clamped: a last turn whose tokens were all dropped with the trailing feedback is empty)
        size_t b = std::min<size_t>(x.turn_starts.empty() ? 0 : x.turn_starts[u], x.tokens.size());
        size_t e = std::clamp<size_t>(u + 1 < x.turn_starts.size() ? x.turn_starts[u + 1] : x.tokens.size(), b,
                                      x.tokens.size());
        envs::TurnRecord turn;
        turn.prompt_tokens = x.prompt_tokens;
        turn.prompt_tokens.insert(turn.prompt_tokens.end(), x.tokens.begin(), x.tokens.begin() + static_cast<std::ptrdiff_t>(b));
        turn.completion_tokens.assign(x.tokens.begin() + static_cast<std::ptrdiff_t>(b), x.tokens.begin() + static_cast<std::ptrdiff_t>(e));
        turn.logprobs.assign(x.logprobs.begin() + static_cast<std::ptrdiff_t>(b), x.logprobs.begin() + static_cast<std::ptrdiff_t>(e));
        if (!x.experts.empty() && x.experts.size() % x.tokens.size() == 0) {  // one record per token
          const size_t w = x.experts.size() / x.tokens.size();
          turn.experts.assign(x.experts.begin() + static_cast<std::ptrdiff_t>(b * w),
                              x.experts.begin() + static_cast<std::ptrdiff_t>(e * w));
        }
        turn.policy_version = r.policy_version;  // (in-flight updates: the first; extra.token_versions has each)
        turn.completion = x.turn_texts.size() > u ? x.turn_texts[u] : x.text;
        turn.truncated = u + 1 == turns && x.truncated;
        // turn 0 saw the prompt (in "prompt"); later turns the env's feedback
        if (env_turns && u < env_turns->size()) {
          const TurnInfo& ti = (*env_turns)[u];
          if (u > 0) turn.observation = ti.observation;
          turn.reward = ti.reward;
          if (json info = json::parse(ti.info_json, nullptr, false); info.is_object()) turn.info = info;
          turn.env_s = ti.env_s;
          turn.generate_s = ti.generate_s;
        } else {
          turn.reward = u + 1 == turns ? g.rewards[j] : 0.0;
          turn.generate_s = u == 0 ? r.gen_s : 0.0;
          if (u + 1 == turns && j < static_cast<int>(g.infos.size()))  // single-turn: the verify's info
            if (json info = json::parse(g.infos[j], nullptr, false); info.is_object() && !info.empty()) turn.info = info;
        }
        t.turns.push_back(std::move(turn));
      }
      t.reward = g.rewards[j];
      auto failed_as = envs::Termination::env_error;
      if (j < static_cast<int>(g.reasons.size()) && !g.reasons[j].empty())
        if (auto p = envs::parse_termination(g.reasons[j]); p.ok()) failed_as = *p;
      t.termination = !g.errors[j].empty()     ? failed_as
                      : g.samples[j].truncated ? envs::Termination::truncated
                                               : envs::Termination::done;
      t.error = g.errors[j];
      if (j < static_cast<int>(g.components.size()) && !g.components[j].empty())
        if (json c = json::parse(g.components[j], nullptr, false); c.is_object())
          for (auto it = c.begin(); it != c.end(); ++it)
            if (it->is_number()) t.reward_components[it.key()] = it->get<double>();
      // the step's sampling and env time (episodes of a step run together)
      t.total_s = r.gen_s + r.env_s;
      t.start_unix_s = now_unix - t.total_s;
      // the episode's identity in the ledger: the step's prompt index and the sample of its group
      t.extra = {{"advantage", adv[gi * G + j]}, {"prompt_index", g.index}, {"sample", j}};
      if (!x.versions.empty()) {  // in-flight updates: [first completion token, policy version] per switch
        json tv = json::array();
        for (size_t i = 0; i < x.versions.size(); ++i) tv.push_back({x.version_starts[i], x.versions[i]});
        t.extra["token_versions"] = std::move(tv);
      }
      (void)(*w)->write(t);
    }
  }
}

}  // namespace troupe::actors::coord
