// logger.trajectories: the first logger.trajectories_per_step samples of each GRPO step, one
// Trajectory row each (prompt, tokens, log-probs, reward, advantage, how it ended), appended to
// run_dir/trajectories/grpo.jsonl.
#include <algorithm>

#include "coordinator_internal.h"
#include "troupe/envs/trajectory.h"

namespace troupe::actors::coord {

void write_trajectories(const RunState& s, const Rollout& r, const std::vector<float>& adv, int64_t step) {
  const int G = s.cfg.rollout.num_generations;
  const int per_step = s.cfg.logger.trajectories_per_step;
  if (!s.cfg.logger.trajectories || per_step <= 0) return;
  auto w = envs::TrajectoryWriter::open(s.run_dir + "/trajectories/grpo.jsonl");
  if (!w.ok()) return;
  int written = 0;
  for (size_t gi = 0; gi < r.groups.size() && written < per_step; ++gi) {
    auto& g = r.groups[gi];
    for (int j = 0; j < G && written < per_step; ++j, ++written) {
      envs::Trajectory t;
      t.episode_id = "grpo-" + std::to_string(step) + "-" + std::to_string(gi) + "-" + std::to_string(j);
      t.env_name = g.env;
      t.seed = g.seed;
      t.step = step;
      t.group = static_cast<int64_t>(gi);
      t.prompt.text = g.prompt_text;
      t.prompt.metadata = g.metadata;
      const GenSample& x = g.samples[j];
      // multi-turn: one Turn per trained turn, holding the tokens appended in that turn
      const size_t turns = std::max<size_t>(1, x.turn_starts.size());
      for (size_t u = 0; u < turns; ++u) {
        size_t b = x.turn_starts.empty() ? 0 : x.turn_starts[u];
        size_t e = u + 1 < x.turn_starts.size() ? x.turn_starts[u + 1] : x.tokens.size();
        envs::TurnRecord turn;
        turn.prompt_tokens = x.prompt_tokens;
        turn.prompt_tokens.insert(turn.prompt_tokens.end(), x.tokens.begin(), x.tokens.begin() + static_cast<std::ptrdiff_t>(b));
        turn.completion_tokens.assign(x.tokens.begin() + static_cast<std::ptrdiff_t>(b), x.tokens.begin() + static_cast<std::ptrdiff_t>(e));
        turn.logprobs.assign(x.logprobs.begin() + static_cast<std::ptrdiff_t>(b), x.logprobs.begin() + static_cast<std::ptrdiff_t>(e));
        turn.policy_version = r.policy_version;
        turn.completion = x.turn_texts.size() > u ? x.turn_texts[u] : x.text;
        turn.truncated = u + 1 == turns && x.truncated;
        turn.observation = u == 0 ? g.prompt_text : std::string();
        turn.reward = u + 1 == turns ? g.rewards[j] : 0.0;
        t.turns.push_back(std::move(turn));
      }
      t.reward = g.rewards[j];
      t.termination = !g.errors[j].empty()     ? envs::Termination::env_error
                      : g.samples[j].truncated ? envs::Termination::truncated
                                               : envs::Termination::done;
      t.error = g.errors[j];
      t.extra = {{"advantage", adv[gi * G + j]}};
      (void)(*w)->write(t);
    }
  }
}

}  // namespace troupe::actors::coord
