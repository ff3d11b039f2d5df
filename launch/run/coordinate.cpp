// Step 7 of `troupe run`, on rank 0: the run directory (created, config.resolved.yaml), the metrics
// sinks (metrics.jsonl, tb/, the progress line, W&B with logger.wandb; rows after a resumed
// checkpoint dropped) and the coordinator over every role; with cluster.join, join.json and the
// job's model identity for the members that join. A planned stop is checkpointed, not a failure; by a signal it exits 1.
#include <cstdio>
#include <filesystem>

#include "run/steps.h"
#include "troupe/actors/step_counter.h"
#include "troupe/launch/member.h"
#include "troupe/launch/metrics.h"
#include "troupe/launch/run_dir_files.h"

namespace troupe::launch::run {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The coordinator's run with its hooks into the sinks, the cluster and the stop signals.
int run_coordinator_into(const actors::ExperimentConfig& cfg, const RunOptions& opt, const actors::RolePeers& peers,
                         runtime::Cluster& cluster, MetricsSinks* s) {
  const std::string& run_dir = cfg.run.dir;
  actors::CoordinatorHooks hooks;
  hooks.metrics = [s](const json& row) { return s->write(row); };
  hooks.log = [s](const std::string& line) { s->message(line); };
  hooks.hold_exit = [&cluster](std::chrono::seconds d) { cluster.hold_exit(d); };
  hooks.stop_requested = [] { return stop_requested(); };
  if (cfg.cluster.join) {  // members may join: the job's model and where they find the job
    auto identity = member_model_identity(cfg);
    if (!identity.ok()) return fail(identity.error());
    hooks.membership = actors::MembershipOptions{true, identity->hash, identity->name, run_dir};
    auto& sys = cluster.system();
    if (Status st = write_join_file(run_dir, sys.endpoint(), sys.curve_public_key()); !st.ok()) return fail(st.error());
    s->message("members may join: troupe join " + run_dir + " --role generator (rank 0 at " + sys.endpoint() + ")");
  }
  Status st = actors::run_coordinator(cfg, peers, hooks, run_dir, !opt.resume_dir.empty());
  s->finish();
  int code = 0;
  if (!st.ok() && actors::is_planned_stop(st.error())) {
    s->message(st.error().message);  // a planned stop, checkpointed: not a failure
    if (st.error().message.rfind(actors::kStoppedBySignal, 0) == 0) code = 1;  // but not finished either
  } else if (!st.ok()) {
    code = fail(st.error());
  } else {
    s->message("done: " + run_dir + "/metrics.jsonl");
  }
  return code;
}

}  // namespace

int coordinate_run(const actors::ExperimentConfig& cfg, const RunOptions& opt, int64_t resume_after,
                   const actors::RolePeers& peers, runtime::Cluster& cluster) {
  const std::string& run_dir = cfg.run.dir;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) {
    std::fprintf(stderr, "troupe: error: cannot create run.dir %s: %s\n", run_dir.c_str(), ec.message().c_str());
    return 1;
  }
  // (replaced atomically: a --resume rewrites it, and a kill then must not leave a run whose own
  // config no longer loads)
  if (Status st = write_file_atomic(run_dir + "/config.resolved.yaml", resolved_yaml(cfg)); !st.ok())
    return fail(st.error());
  const int total_steps = static_cast<int>(actors::StepCounter::of(cfg).sft_steps) + (cfg.grpo.enabled ? cfg.grpo.max_steps : 0);
  ProgressOptions po{cfg.logger.progress, cfg.run.name, total_steps};
  auto sinks = MetricsSinks::open(run_dir, cfg.logger.tensorboard, po, resume_after);
  if (!sinks.ok()) return fail(sinks.error());
  const auto& wb = cfg.logger.wandb;
  if (!wb.project.empty() && wb.mode != actors::WandbMode::disabled) {
    MetricsSinks* s = sinks->get();
    WandbOptions wo;
    wo.project = wb.project;
    wo.name = wb.name.empty() ? cfg.run.name : wb.name;
    wo.mode = wb.mode;
    wo.run_dir = run_dir;
    wo.config_file = run_dir + "/config.resolved.yaml";
    auto w = WandbSink::start(wo, [s](const std::string& m) { s->message(m); });
    if (!w.ok()) return fail(w.error());
    s->message("W&B run (" + enum_string(wb.mode) + ") in " + run_dir + "/wandb, its log " + (*w)->log_path());
    s->attach_wandb(std::move(*w));
  }
  return run_coordinator_into(cfg, opt, peers, cluster, sinks->get());
}

}  // namespace troupe::launch::run
