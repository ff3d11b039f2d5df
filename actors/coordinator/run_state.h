// The coordinator's run state (internal to actors/coordinator/), split by concern: the run's setup
// and placement (config, roles, tokenizer, which generators are alive), the sinks its rows and log
// lines go to, its progress (steps done and saved, timing, evals), the weight sync's state, and the
// GRPO phase's pipeline. RunState is all of them; a function that needs one concern takes that one.
// It lives in the coordinator actor and is only touched on the actor's thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/coordinator.h"
#include "troupe/actors/experiment_config.h"
#include "troupe/actors/step_counter.h"
#include "troupe/actors/weight_sync.h"
#include "troupe/base/clock.h"
#include "troupe/base/result.h"
#include "troupe/envs/reward_center.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/runtime/coroutine.h"

namespace troupe::actors::coord {

using json = nlohmann::json;
using runtime::ActorId;

class StepPipeline;

// Members that joined the running job (troupe join) and what every generator did (troupe status).
struct MemberRecord {
  std::string name, role, host, endpoint;
  std::string env, env_address;   // role env: the env whose pool the server joined, and its address
  std::uint32_t node = 0;
  int capacity = 0;
  std::string state = "pending";  // pending (until the next weight sync), active, leaving, left, down
  int64_t joined_step = -1, admitted_step = -1, first_work_step = -1, left_step = -1;
  int64_t index = -1;             // in peers.generators (or peers.scorers) once admitted
  runtime::ReplyTo leave_reply;   // a LeaveReq, answered once its work is done
  int64_t leave_at_sync = 0;      // the weight sync (Membership::syncs) that answers it
  bool relays = false;            // the job's nodes can reach its endpoint: a relay tree may pass versions through it
};
struct GeneratorLoad {
  int64_t requests = 0, samples = 0, failures = 0;
  int64_t last_step = -1, last_samples = 0;  // the latest step it sampled for, and how many then
};
struct Membership {
  std::vector<MemberRecord> members;
  std::vector<GeneratorLoad> load;  // by generator index
  std::vector<char> leaving;        // by generator index: sent no more work
  // by generator index: the oldest policy version a member can sample with (the one its first,
  // full weights had; unknown until that sync is done); -1 for the generators the run started with
  std::vector<int64_t> min_version;
  bool takes(size_t g, int64_t version) const {
    if (g < leaving.size() && leaving[g]) return false;
    return version < 0 || g >= min_version.size() || min_version[g] <= version;
  }
  int64_t syncs = 0;
  const MemberRecord* generator(size_t g) const {  // generator g's record, if it is a member that joined the running job
    for (const auto& m : members)
      if (m.role == "generator" && m.index == static_cast<int64_t>(g)) return &m;
    return nullptr;
  }
  bool joined(size_t g) const { return generator(g) != nullptr; }
  int64_t step = 0;  // the latest step a rollout was asked for (RunProgress::step moves per phase in GRPO)
  GeneratorLoad& of(size_t g) {
    if (load.size() <= g) load.resize(g + 1);
    return load[g];
  }
};

// What the run is and who plays it: the config, the roles and the coordinator's own context, the
// tokenizer, and which generators are still alive.
struct RunSetup {
  ExperimentConfig cfg;
  RolePeers peers;
  std::string run_dir;
  runtime::ActorContext here;  // the Context the coroutines send with
  std::unique_ptr<policy::io::Tokenizer> tokenizer;
  std::shared_ptr<const policy::io::ChatTemplate> chat_template;  // policy.path's (rollout.template chat)
  std::vector<std::string> serve_urls;  // each generator's rollout.serve endpoint (asked on first use)

  StepCounter steps() const { return StepCounter::of(cfg); }
  ActorId env_worker(size_t i) const { return peers.env_workers[i % peers.env_workers.size()]; }
  // A generator whose rank is down (under mpirun with two or more generators a dead generator
  // does not end the job: its prompts go to the others, generation_failover in rollout.cpp).
  // In one process a generator thread can die alone (its actor failed): generators_down.
  std::vector<char> generators_down;
  Membership membership;
  bool generator_alive(size_t g) const {
    if (g < generators_down.size() && generators_down[g]) return false;
    if (g < membership.leaving.size() && membership.leaving[g]) return false;
    return !peers.system || !peers.system->node_is_down(peers.generators[g].node);
  }
  void mark_generator_down(size_t g) {
    generators_down.resize(peers.generators.size(), 0);
    generators_down[g] = 1;
  }
  // The first live generator at or after g (cyclically), or none when every one is down.
  std::optional<size_t> live_generator_from(size_t g) const {
    for (size_t d = 0; d < peers.generators.size(); ++d)
      if (generator_alive((g + d) % peers.generators.size())) return (g + d) % peers.generators.size();
    return std::nullopt;
  }
};

// Where the run's metric rows and log lines go (the launcher's hooks, called on the actor's thread).
struct RunSinks {
  CoordinatorHooks hooks;
  Status emit(json row) const { return hooks.metrics ? hooks.metrics(row) : Status{}; }
  void log(const std::string& line) const {
    if (hooks.log) hooks.log(line);
  }
};

// How far the run is: the global step, what is finished and saved, its clock, its evals.
struct RunProgress {
  int64_t step = 0;        // global step (SFT steps, then GRPO steps: StepCounter)
  double wall_offset = 0;  // wall_s already spent before a resume
  double t0 = 0;
  json last_eval;
  int64_t last_eval_step = -1;
  // checkpointing.keep_best_by: the best value checkpointed so far (read from checkpoints/best on
  // first use, so a resumed run knows it); an eval that beats it is checkpointed at once.
  bool best_known = false;
  std::optional<double> best_value;
  // Steps finished (trained and logged) and the last one checkpointed: when the run fails for a
  // reason other than a learner (an env that keeps crashing, a generator), what is done is saved.
  int64_t done_step = 0;
  int64_t saved_step = 0;
  bool learner_dirty = false;    // an update was sent for a step that is not done yet
  int64_t trained_episodes = 0;  // the ledger's count: episodes of the GRPO steps trained so far

  double now_s() const { return wall_offset + mono_seconds() - t0; }

  // Each env's train draws so far (EnvResetReq::draw numbers them: the dataset env's shuffle
  // order), and their counts before each GRPO step's rollout began, so a checkpoint saves the
  // counts that go with the rollouts it keeps. Checkpointed (state.json's "draws").
  std::map<std::string, int64_t> draws;
  std::map<int64_t, std::map<std::string, int64_t>> draws_before_rollout;
  int64_t next_draw(const std::string& env) { return draws[env]++; }
  void note_draws_before(int64_t k) {
    draws_before_rollout[k] = draws;
    while (draws_before_rollout.size() > 64) draws_before_rollout.erase(draws_before_rollout.begin());
    centering_before_rollout[k] = centering;
    while (centering_before_rollout.size() > 64) centering_before_rollout.erase(centering_before_rollout.begin());
  }
  // type: reward_model envs with config.center batch or running: their centering by env (made on
  // first use, reward_centering.cpp), and its state before each GRPO step's rollout began, saved
  // with the draws (state.json's "reward_centering") so a resumed run's running means go on as before.
  std::map<std::string, envs::RewardCentering> centering;
  std::map<int64_t, std::map<std::string, envs::RewardCentering>> centering_before_rollout;
  // The counts once GRPO step `through`'s rollout is done (the next one may have begun already).
  const std::map<std::string, int64_t>& draws_after(int64_t through) const {
    auto it = draws_before_rollout.find(through + 1);
    return it != draws_before_rollout.end() ? it->second : draws;
  }
};

// The weights: the learners' policy version (the generators' once synced) and what each generator holds.
struct SyncState {
  int64_t version = 0;                      // learner policy version
  std::unique_ptr<WeightSync> weight_sync;  // what each generator holds (made on the first sync)
};

// The GRPO phase's step pipeline (sync or async, step_pipeline.h) while that phase runs.
struct PipelineSlot {
  StepPipeline* pipeline = nullptr;  // set while a GRPO phase runs
  std::string resumed_pipeline;      // the checkpoint's pipeline.bin (--resume of an async run)
};

struct RunState : RunSetup, RunSinks, RunProgress, SyncState, PipelineSlot {};

}  // namespace troupe::actors::coord
