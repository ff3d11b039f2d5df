// The coordinator: owns the step loop (SFT phase, then GRPO), prompt scheduling by env weight,
// grouping by prompt, advantages, batching, weight sync (learner -> generators as a Weights
// message), evaluation, checkpoints and metric rows. It reaches the roles only through messages.
// Invariant: every random choice is a pure function of (run.seed, step, index), so a sync run on
// CPU is bit-identical across runs and across --resume.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/experiment_config.h"
#include "troupe/actors/messages.h"
#include "troupe/base/result.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/runtime/system.h"

namespace troupe::actors {

struct RolePeers {
  runtime::ActorSystem* system = nullptr;
  std::vector<runtime::ActorId> env_workers, generators, learners;
};

struct CoordinatorHooks {
  std::function<Status(const nlohmann::json& row)> metrics;  // one row per step / evaluation
  std::function<void(const std::string& line)> log;
  // Before the coordinator saves what is done after a failure: keep the process alive this long
  // (the launcher's peer-failure watchdog would otherwise end it within its grace).
  std::function<void(std::chrono::seconds)> hold_exit;
};

// Deterministic 64-bit mix of (seed, a, b, c).
uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);

class Coordinator {
 public:
  Coordinator(ExperimentConfig cfg, RolePeers peers, CoordinatorHooks hooks, std::string run_dir);
  ~Coordinator();

  // The whole run. resume: continue from run_dir/checkpoints/latest.
  Status run(bool resume);
  // Held-out evaluation with the generators' current weights (greedy): eval_accuracy,
  // eval_reward_mean, and the same per env ("eval_accuracy/<env>"). With rollout.max_turns > 1 each
  // prompt is a full greedy episode, as in training: eval_accuracy = episodes solved, eval_reward_mean =
  // episode reward, eval_turns_mean = env steps per episode.
  Result<nlohmann::json> evaluate();
  // Global step reached (for tests).
  int64_t step() const { return step_; }

  // Per-step time breakdown of the last GRPO step (seconds).
  struct Breakdown {
    double generation = 0, env = 0, learner = 0, weight_sync = 0, idle = 0, step = 0;
  };

 private:
  struct Rollout;
  struct Async;
  Status run_sft(int64_t first_step);
  Status run_grpo(int64_t first_step);
  Result<Rollout> make_rollout(int64_t step, int64_t k);
  using PartSink = std::function<void(Rollout&& part)>;
  // One generation round. With a sink: in rollout.async_chunks parts, each handed to the sink as
  // soon as it is scored (its groups move there).
  Result<Rollout> make_round(int64_t step, int64_t k, int round, const PartSink* sink = nullptr);
  Result<Rollout> multi_turn(Rollout r, int64_t step, int64_t k);
  struct Prepared {  // what a rollout gives the learners
    std::vector<TrainSample> samples;
    std::vector<float> adv;  // per sample of the rollout's groups (0 where not kept)
    int groups_kept = 0, stale_dropped = 0;
  };
  struct Trained {  // what the learners gave back
    bool updated = false;
    nlohmann::json metrics = nlohmann::json::object();
    double learner_s = 0;
  };
  Result<Prepared> prepare(const Rollout& r) const;
  Status train_on(Rollout& r, int64_t step, int64_t k, double step_start, double gen_idle);
  Status train_streamed(int64_t step, int64_t k, double step_start);
  Status log_grpo_step(const Rollout& r, const Prepared& p, const Trained& tr, int64_t step,
                       double step_start, double gen_idle);
  Status sync_weights(double* seconds);
  Status eval_and_log(const std::string& phase);
  Status checkpoint(const std::string& phase, bool force, runtime::Duration timeout = std::chrono::hours(2));
  Status emit(nlohmann::json row);
  double now_s() const;
  size_t pick_env(uint64_t r) const;

  ExperimentConfig cfg_;
  RolePeers peers_;
  CoordinatorHooks hooks_;
  std::string run_dir_;
  std::unique_ptr<policy::io::Tokenizer> tokenizer_;
  int64_t step_ = 0;          // global step (SFT steps, then GRPO steps)
  int64_t version_ = 0;       // learner policy version
  double wall_offset_ = 0;    // wall_s already spent before a resume
  double t0_ = 0;
  nlohmann::json last_eval_;
  int64_t last_eval_step_ = -1;
  // checkpointing.keep_best_by: the best value checkpointed so far (read from checkpoints/best on
  // first use, so a resumed run knows it); an eval that beats it is checkpointed at once.
  bool improves_best(double value);
  bool best_known_ = false;
  std::optional<double> best_value_;
  // Steps finished (trained and logged) and the last one checkpointed: when the run fails for a
  // reason other than a learner (an env that keeps crashing, a generator), what is done is saved.
  int64_t done_step_ = 0;
  int64_t saved_step_ = 0;
  bool learner_dirty_ = false;  // an update was sent for a step that is not done yet
  Status save_what_is_done(const Error& cause);
  std::unique_ptr<Async> async_;
};

}  // namespace troupe::actors
