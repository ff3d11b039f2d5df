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
#include <string>
#include <vector>

#include "troupe/actors/experiment_config.h"
#include "troupe/actors/membership.h"
#include "troupe/base/result.h"
#include "troupe/base/seed_streams.h"
#include "troupe/runtime/system.h"

namespace troupe::actors {

struct RolePeers {
  runtime::ActorSystem* system = nullptr;  // the coordinator's (run_coordinator spawns it there)
  std::vector<runtime::ActorId> env_workers, generators, learners;
  std::vector<runtime::ActorId> scorers;  // cluster.scorers: the frozen models (distill.teacher, judges)
};

// Called on the coordinator actor's thread, one at a time.
struct CoordinatorHooks {
  std::function<Status(const nlohmann::json& row)> metrics;  // one row per step / evaluation
  std::function<void(const std::string& line)> log;
  // Before the coordinator saves what is done after a failure: keep the process alive this long
  // (the launcher's peer-failure watchdog would otherwise end it within its grace).
  std::function<void(std::chrono::seconds)> hold_exit;
  // True once a signal (SIGTERM, SIGINT) asked the run to stop: after the step in progress the
  // coordinator checkpoints it and ends the run with an error starting kStoppedBySignal.
  std::function<bool()> stop_requested;
  // cluster.join: who may join the running job (JoinReq, LeaveReq and MembersReq are always answered).
  MembershipOptions membership;
};

// The message prefix of the two planned stops (not failures): run.max_wall_s reached, a signal.
inline constexpr const char* kStoppedByWallClock = "run.max_wall_s";
inline constexpr const char* kStoppedBySignal = "stopped by a signal";
inline bool is_planned_stop(const Error& e) {
  return e.code == ErrorCode::timeout &&
         (e.message.rfind(kStoppedByWallClock, 0) == 0 || e.message.rfind(kStoppedBySignal, 0) == 0);
}

// Deterministic 64-bit mix of (seed, a, b, c); the streams are named in troupe/base/seed_streams.h.
using troupe::mix_seed;

// The coordinator actor. Spawned on the system of RolePeers, it starts its job in on_start and
// runs it as coroutines (runtime/coroutine.h): every wait for a role is a request whose reply
// continuation resumes the step loop on this actor's thread, so no actor thread ever blocks.
// When the job ends it stops itself and calls on_end once, from its own thread: train/resume
// give {"step": the global step reached} or the run's error, evaluate gives the eval row.
class Coordinator : public runtime::Actor {
 public:
  enum class Job {
    train,     // the whole run: eval at start, SFT, GRPO, checkpoints, metric rows
    resume,    // the same, continuing from run_dir/checkpoints/latest
    evaluate,  // held-out greedy evaluation with the generators' current weights (troupe eval)
  };
  using OnEnd = std::function<void(Result<nlohmann::json>)>;
  Coordinator(ExperimentConfig cfg, RolePeers peers, CoordinatorHooks hooks, std::string run_dir, Job job,
              OnEnd on_end);
  ~Coordinator() override;
  void on_start(runtime::Context& ctx) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// For a thread that is no actor's (the launcher, a test): spawn a Coordinator named
// "coordinator" on peers.system and wait until its job ends.
//
// The whole run (resume: continue from run_dir/checkpoints/latest). A planned run.max_wall_s stop
// is an ErrorCode::timeout whose message starts with "run.max_wall_s"; another failure first
// saves the steps that are done, and the error says so.
Status run_coordinator(ExperimentConfig cfg, RolePeers peers, CoordinatorHooks hooks, std::string run_dir,
                       bool resume);
// Held-out evaluation with the generators' current weights (greedy): eval_accuracy,
// eval_reward_mean, and the same per env ("eval_accuracy/<env>"). With rollout.max_turns > 1 each
// prompt is a full greedy episode, as in training: eval_accuracy = episodes solved,
// eval_reward_mean = episode reward, eval_turns_mean = env steps per episode.
Result<nlohmann::json> evaluate_policy(ExperimentConfig cfg, RolePeers peers);

}  // namespace troupe::actors
