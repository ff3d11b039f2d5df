// `troupe run` and `troupe eval`: run_experiment takes the steps in launch/run/ in order (detect
// the launcher, check the world, plan placement, check the run directory, start the cluster, spawn
// the roles, run the coordinator on rank 0 while the others serve, stop); eval_checkpoint runs a
// generator and an env worker in one process over the held-out prompts.
#include "troupe/launch/run.h"

#include <cstdio>
#include <filesystem>

#include "run/steps.h"
#include "troupe/actors/scorer.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/learner/lora_checkpoint.h"
#include "troupe/serve/lora_adapters.h"
#include "troupe/serve/rollout_serve.h"

namespace troupe::launch {
namespace fs = std::filesystem;
using actors::ExperimentConfig;
using json = nlohmann::json;

namespace run {

int fail(const Error& e) {
  std::fprintf(stderr, "troupe: error: %s\n", e.message.c_str());
  return exit_code_for(e.code);
}

std::string base_dir_of(const std::string& file) {
  fs::path p(file);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

}  // namespace run

namespace {

using run::base_dir_of;
using run::fail;

// Steps 6 and 7 on a started cluster: spawn this process's roles, serve rollout.serve's endpoints,
// then rank 0 runs the coordinator and stops the others while they serve until it does.
int run_on_cluster(const ExperimentConfig& cfg, const RunOptions& opt, const run::Placement& placement,
                   const std::vector<envs::EnvSpec>& specs, int rank_threads, int64_t resume_after,
                   runtime::Cluster& cluster) {
  const bool single = !cluster.under_mpi();
  auto comm = run::learners_communicator(cluster, cfg.cluster.learners);
  if (!comm.ok()) return fail(comm.error());
  auto hosted = run::spawn_roles(cfg, placement, cluster, std::move(comm).value(), specs, rank_threads);
  if (!hosted.ok()) return fail(hosted.error());
  if (!single) {
    Status st = run::spawn_control_actor(cluster);
    if (!st.ok()) return fail(st.error());
  }
  // rollout.serve: every hosted generator's OpenAI-compatible endpoint listens before the run starts
  auto serving = serve::RolloutServers::start(cfg, hosted->gens, hosted->gen_indices);
  if (!serving.ok()) return fail(serving.error());
  cluster.barrier();  // every rank's actors exist before the coordinator sends
  if (single) run::install_stop_signals(true);
  if (!single) run::arm_graceful_stop(&cluster.system(), cluster.rank());

  int code = 0;
  if (cluster.rank() == 0) {
    code = run::coordinate_run(cfg, opt, resume_after, hosted->peers, cluster);
    if (!single) run::stop_other_ranks(cluster, placement.size(), code);
  } else {
    cluster.wait();  // serve until rank 0 ends the run (or a peer fails)
  }
  run::disarm_graceful_stop();
  int fin = cluster.finish();
  return code != 0 ? code : fin;
}

}  // namespace

int run_experiment(const LoadedConfig& loaded, const RunOptions& opt) {
  ExperimentConfig cfg = loaded.config;
  const run::Launcher launcher = run::detect_launcher();
  const run::Placement placement = run::plan_placement(cfg.cluster);
  if (int rc = run::check_world(loaded, launcher, placement.size()); rc != 0) return rc;
  std::string run_dir = opt.resume_dir.empty() ? cfg.run.dir : opt.resume_dir;
  cfg.run.dir = run_dir;
  int64_t resume_after = -1;  // the checkpoint's step: metric rows after it are dropped
  // (several ranks: they share the checkpoint's checksum reads once started, verify_resume_shared)
  const bool shared_reads = launcher.mpi && placement.size() > 1;
  if (int rc = run::check_run_dir(loaded, opt, run_dir, shared_reads, &resume_after); rc != 0) return rc;
  auto specs = actors::env_specs(cfg, base_dir_of(loaded.file));
  if (!specs.ok()) return fail(specs.error());
  const int rank_threads = run::set_compute_threads(cfg.cluster.threads, launcher);
  std::unique_ptr<runtime::Cluster> cluster;
  if (int rc = run::start_cluster(loaded, cfg, launcher, placement, &cluster); rc != 0) return rc;
  if (shared_reads && !opt.resume_dir.empty())
    if (int rc = run::verify_resume_shared(*cluster, run_dir); rc != 0) return rc;
  return run_on_cluster(cfg, opt, placement, *specs, rank_threads, resume_after, *cluster);
}

namespace {

// The base an adapter checkpoint is evaluated on: --base, else policy.path, else its base.json's
// path ("" for a LoRA run on a fresh base, which records none).
Result<std::string> eval_base_path(const ExperimentConfig& cfg, const std::string& checkpoint, const std::string& base) {
  if (!base.empty()) return base;
  if (!cfg.policy.path.empty()) return cfg.policy.path;
  if (cfg.policy.lora.enabled() && !fs::exists(fs::path(checkpoint) / policy::io::kAdapterBaseFile)) return std::string();
  TROUPE_ASSIGN_OR_RETURN(auto ref, serve::adapter_base_ref(checkpoint, "", "--base"));
  return ref.path;
}

// The checkpoint's adapter on the generator's model: base.json's fingerprint checked against the base,
// then a LoRA run's adapters read as --resume reads them (policy.lora), or else any adapter applied as
// a LoRA of its own (its r, alpha and modules).
Status load_eval_adapter(const ExperimentConfig& cfg, const std::string& checkpoint, policy::Model& model) {
  policy::io::AdapterBaseRef ref;
  if (!cfg.policy.path.empty()) {
    TROUPE_ASSIGN_OR_RETURN(ref, serve::adapter_base_ref(checkpoint, cfg.policy.path));
    TROUPE_ASSIGN_OR_RETURN(std::string fingerprint, serve::base_fingerprint_of(cfg.policy.path, model));
    TROUPE_TRY(serve::check_base_fingerprint(ref, fingerprint, checkpoint));
  }
  if (cfg.policy.lora.enabled()) return learner::read_lora_adapter_files(checkpoint, model);
  TROUPE_ASSIGN_OR_RETURN(auto adapter, serve::read_adapter_for(checkpoint, ref, model));
  return serve::apply_adapter(model, adapter);
}

// The models `troupe eval` serves on a scorer: what the config's scorers serve but the teacher
// (distill is training only): each judge's local model and, with cluster.scorers >= 1, each
// reward_model env's model (without scorers such an env worker loads its model itself).
std::vector<std::string> eval_scorer_paths(ExperimentConfig cfg) {
  cfg.distill.teacher.clear();
  if (cfg.cluster.scorers < 1) return {};
  return actors::scorer_model_paths(cfg);
}

// One scorer actor for `troupe eval` when the config's envs need one (eval_scorer_paths), its
// address installed for the env workers (set_scorer_peers) before they are made; none otherwise.
Result<std::vector<runtime::ActorId>> spawn_eval_scorer(const ExperimentConfig& cfg, runtime::ActorSystem& sys) {
  const auto paths = eval_scorer_paths(cfg);
  std::vector<runtime::ActorId> ids;
  if (!paths.empty()) {
    TROUPE_ASSIGN_OR_RETURN(std::shared_ptr<actors::Scorer> sp,
                            actors::Scorer::create(paths, cfg.policy, cfg.distill.teacher_dtype));
    const int n = actors::role_threads(cfg.cluster, "scorer", 2);
    TROUPE_ASSIGN_OR_RETURN(runtime::ActorId id, sys.spawn([sp, n]() -> std::unique_ptr<runtime::Actor> {
      return std::make_unique<actors::ScorerActor>(sp, n);
    }));
    ids.push_back(id);
  }
  actors::set_scorer_peers(sys, ids, cfg);
  return ids;
}

}  // namespace

int eval_checkpoint(const LoadedConfig& loaded, const std::string& checkpoint, const std::string& base) {
  ExperimentConfig cfg = loaded.config;
  const bool adapter = serve::is_adapter_dir(checkpoint);
  if (adapter) {  // a LoRA checkpoint or PEFT adapter holds the adapters alone: the base is the config's, as in the run
    auto base_path = eval_base_path(cfg, checkpoint, base);
    if (!base_path.ok()) return fail(base_path.error());
    cfg.policy.path = *base_path;
  } else if (!base.empty()) {
    return fail(invalid_input("--base " + base + ": only for an adapter checkpoint, and " + checkpoint + " has no " +
                              policy::io::kAdapterConfigFile));
  } else if (!cfg.policy.lora.enabled()) {
    cfg.policy.path = checkpoint;
    cfg.policy.tokenizer = actors::TokenizerKind::from_model;
  }
  auto specs = actors::env_specs(cfg, base_dir_of(loaded.file));
  if (!specs.ok()) return fail(specs.error());
  runtime::SystemConfig sc;
  sc.threads = 2;
  auto sys_r = runtime::ActorSystem::create(sc);
  if (!sys_r.ok()) return fail(sys_r.error());
  auto& sys = **sys_r;
  auto scorers = spawn_eval_scorer(cfg, sys);
  if (!scorers.ok()) return fail(scorers.error());
  auto g = actors::Generator::create(cfg);
  if (!g.ok()) return fail(g.error());
  auto e = actors::EnvWorker::create(*specs);
  if (!e.ok()) return fail(e.error());
  std::shared_ptr<actors::Generator> gp = std::move(g).value();
  if (adapter) {
    if (Status s = load_eval_adapter(cfg, checkpoint, gp->model()); !s.ok()) return fail(s.error());
  } else if (cfg.policy.lora.enabled()) {
    if (Status s = learner::read_lora_adapter_files(checkpoint, gp->model()); !s.ok()) return fail(s.error());
  }
  std::shared_ptr<actors::EnvWorker> ep = std::move(e).value();
  auto gid = sys.spawn([gp]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<actors::GeneratorActor>(gp); });
  auto eid = sys.spawn([ep]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<actors::EnvActor>(ep); });
  if (!gid.ok()) return fail(gid.error());
  if (!eid.ok()) return fail(eid.error());
  actors::RolePeers peers{&sys, {*eid}, {*gid}, {}, *scorers};
  auto r = actors::evaluate_policy(cfg, peers);
  sys.shutdown();
  if (!r.ok()) return fail(r.error());
  json out = *r;
  out["checkpoint"] = checkpoint;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace troupe::launch
