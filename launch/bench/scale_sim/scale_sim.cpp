// run_scale_sim (scale_sim.h): the real Coordinator and the simulated roles on one deterministic
// ActorSystem. The driver runs queued mail until idle, then moves the manual clock to the next
// simulated reply, until the coordinator's job ends. Everything runs on this thread, so the
// coordinator's cost is this thread's CPU time times the share of its wall time not spent in the
// simulated roles' handlers (those are timed by the steady clock, which is cheap; a thread's CPU
// clock is a system call, too dear for thousands of handlers per step). Preemption on a loaded
// machine then stretches both shares alike and the estimate stays the CPU time the coordinator
// (and the runtime's delivery of its messages) used.
#include "troupe/bench/scale_sim.h"

#include <time.h>

#include <memory>
#include <optional>

#include "simulated_roles.h"
#include "troupe/actors/coordinator.h"

namespace troupe::bench {

namespace {

using json = nlohmann::json;
using runtime::Clock;
using actors::Coordinator;
using actors::EnvSpec;
using actors::CoordinatorHooks;
using actors::ExperimentConfig;
using actors::RolePeers;
using actors::WeightSyncMode;

ExperimentConfig experiment_for(const ScaleSimConfig& c) {
  ExperimentConfig e;
  e.run.seed = static_cast<int>(c.seed % 1000000007ull);
  e.run.dir = "";
  EnvSpec env;
  env.name = "sim";
  env.env = "arithmetic";
  e.envs.push_back(env);
  e.sft.enabled = false;
  e.grpo.max_steps = c.steps;
  e.rollout.num_generations = c.num_generations;
  e.rollout.prompts_per_step = c.generators * c.groups_per_generator;
  e.rollout.max_prompt_length = c.prompt_tokens;
  e.rollout.max_response_length = c.max_response_tokens;
  e.rollout.async = c.async;
  e.rollout.max_staleness = c.max_staleness;
  e.weight_sync.mode = WeightSyncMode::delta;  // full at the start and every full_every versions
  e.weight_sync.probe = false;
  e.weight_sync.relay_fanout = c.relay_fanout;
  e.checkpointing.enabled = false;
  e.logger.trajectories = false;
  e.logger.tensorboard = false;
  e.eval.every = 0;
  e.eval.num_prompts = 1;
  e.cluster.learners = c.learners;
  e.cluster.generators = c.generators;
  e.cluster.env_workers = c.env_workers > 0 ? c.env_workers : c.generators;
  return e;
}

// At each step's metric row, so far: the simulated time, this thread's wall and CPU time, and the
// wall time in the simulated roles' handlers.
struct Mark {
  double sim_s = 0, total_s = 0, roles_s = 0, cpu_s = 0;
};

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

Result<ScaleSimReport> run_scale_sim(const ScaleSimConfig& cfg) {
  if (cfg.generators < 1 || cfg.learners < 1 || cfg.steps < 2 || cfg.groups_per_generator < 1 ||
      cfg.num_generations < 1 || cfg.max_response_tokens < 1)
    return make_error(ErrorCode::invalid_input,
                      "scale sim: generators, learners, groups_per_generator, num_generations and "
                      "max_response_tokens must be >= 1 and steps >= 2");
  // (declared before the system, so that they outlive its actors, which refer to them)
  auto world = std::make_unique<sim::SimWorld>();
  world->cfg = cfg;
  ExperimentConfig exp = experiment_for(cfg);
  std::vector<Mark> marks;
  std::optional<Result<json>> end;
  double wall0 = 0, roles0 = 0;
  Clock::time_point t0{};

  runtime::SystemConfig sc;
  sc.threads = 0;                   // deterministic: this thread runs everything, the clock is manual
  sc.mailbox_capacity = 1u << 20;   // a fan-out to 1,000 roles lands before any of them runs
  sc.role = "scale_sim";
  TROUPE_ASSIGN_OR_RETURN(auto sys, runtime::ActorSystem::create(sc));
  RolePeers peers;
  peers.system = sys.get();
  for (int i = 0; i < exp.cluster.env_workers; ++i) {
    TROUPE_ASSIGN_OR_RETURN(auto id, sys->spawn([w = world.get(), i] { return sim::make_sim_env(*w, i); }));
    peers.env_workers.push_back(id);
  }
  for (int i = 0; i < cfg.generators; ++i) {
    TROUPE_ASSIGN_OR_RETURN(auto id, sys->spawn([w = world.get()] { return sim::make_sim_generator(*w); }));
    peers.generators.push_back(id);
  }
  for (int i = 0; i < cfg.learners; ++i) {
    TROUPE_ASSIGN_OR_RETURN(auto id, sys->spawn([w = world.get(), i] { return sim::make_sim_learner(*w, i); }));
    peers.learners.push_back(id);
  }
  sys->run_until_idle();

  t0 = sys->now();
  wall0 = mono_seconds();
  roles0 = world->roles_s;
  auto sim_now = [&] { return std::chrono::duration<double>(sys->now() - t0).count(); };
  CoordinatorHooks hooks;
  hooks.metrics = [&](const json& row) -> Status {
    if (row.contains("staleness"))  // a training step's row (not the closing evaluation's)
      marks.push_back({sim_now(), mono_seconds() - wall0, world->roles_s - roles0, thread_cpu_s()});
    return {};
  };
  auto factory = [&]() -> std::unique_ptr<runtime::Actor> {
    return std::make_unique<Coordinator>(exp, peers, hooks, "", Coordinator::Job::train,
                                         [&end](Result<json> r) { end = std::move(r); });
  };
  TROUPE_ASSIGN_OR_RETURN(auto coordinator, sys->spawn(factory, runtime::SpawnOptions().named("coordinator")));
  (void)coordinator;

  while (!end) {
    sys->run_until_idle();
    if (end) break;
    while (!world->due.empty() && world->due.top() <= sys->now()) world->due.pop();
    if (world->due.empty())
      return make_error(ErrorCode::internal, "scale sim: stalled at " + std::to_string(sim_now()) +
                                                 " simulated s: the coordinator waits for a reply no simulated "
                                                 "role will send (" + std::to_string(marks.size()) + " steps done)");
    sys->advance(world->due.top() - sys->now());
  }
  sys->shutdown(std::chrono::seconds(0));
  if (!end->ok()) return end->error();

  ScaleSimReport rep;
  rep.steps = static_cast<int>(marks.size());
  rep.messages = world->messages;
  rep.staleness = world->staleness;
  rep.roles_s = world->roles_s - roles0;
  double prev = 0;
  for (const auto& m : marks) {
    rep.step_sim_s.push_back(m.sim_s - prev);
    prev = m.sim_s;
  }
  if (marks.size() >= 2) {
    const Mark& a = marks.front();
    const Mark& b = marks.back();
    const double steps = static_cast<double>(marks.size() - 1);
    rep.sim_s = b.sim_s - a.sim_s;
    rep.steps_per_s = rep.sim_s > 0 ? steps / rep.sim_s : 0;
    const double wall = b.total_s - a.total_s, roles = b.roles_s - a.roles_s;
    rep.coordinator_s = wall > 0 ? (b.cpu_s - a.cpu_s) * (1.0 - roles / wall) : 0.0;
    rep.coordinator_ms_per_step = 1e3 * rep.coordinator_s / steps;
  }
  return rep;
}

}  // namespace troupe::bench
