// logger.trajectories: the first logger.trajectories_per_step samples of each GRPO step, one
// Trajectory row each (prompt, tokens, log-probs, reward, advantage, how it ended), appended to
// run_dir/trajectories/grpo.jsonl.
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
      envs::TurnRecord turn;
      turn.prompt_tokens = g.samples[j].prompt_tokens;
      turn.completion_tokens = g.samples[j].tokens;
      turn.logprobs = g.samples[j].logprobs;
      turn.policy_version = r.policy_version;
      turn.completion = g.samples[j].text;
      turn.truncated = g.samples[j].truncated;
      turn.observation = g.prompt_text;
      turn.reward = g.rewards[j];
      t.turns.push_back(std::move(turn));
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
