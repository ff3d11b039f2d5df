// Step 4 of `troupe run`: the run directory before anything is written. A new run's run.dir holds no
// run; `--resume RUN_DIR` has a whole checkpoints/latest and the run's own config.resolved.yaml up to
// the keys a resume may change (every rank checks; errors exit 2 and change nothing). In a job of
// several ranks the checkpoint's bytes are checksummed once the ranks are up, each file by one rank.
#include <mpi.h>

#include <cstdio>
#include <filesystem>

#include "run/steps.h"
#include "troupe/learner/checkpoint.h"

namespace troupe::launch::run {
namespace fs = std::filesystem;

namespace {

// The error of a --resume whose checkpoint `latest` is not whole: the earlier checkpoints that are,
// newest first (the run can go on from one of them). Exit code 2.
int report_bad_checkpoint(const std::string& run_dir, const std::string& latest, const std::string& error) {
  const std::string ckpts = run_dir + "/checkpoints";
  const auto steps = learner::checkpoint_steps(ckpts);
  std::error_code ec;
  std::string whole;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string dir = ckpts + "/" + it->second;
    if (!fs::equivalent(dir, latest, ec) && learner::verify_checkpoint(dir).ok())
      whole += (whole.empty() ? "" : ", ") + it->second;
  }
  std::fprintf(stderr, "troupe: error: --resume %s: %s; nothing in the run directory was changed. %s\n",
               run_dir.c_str(), error.c_str(),
               whole.empty() ? "No earlier checkpoint is whole either."
                             : ("Earlier checkpoints that are whole: " + whole + "; to go on from the newest: ln -sfn " +
                                whole.substr(0, whole.find(',')) + " " + ckpts + "/latest")
                                   .c_str());
  return 2;
}

// Before a --resume touches the run directory (every rank checks, nothing is written): the
// checkpoint it continues from is whole (with shared_reads its listing and sizes here, its bytes in
// verify_resume_shared), and the config is the run's own (config.resolved.yaml) up to the keys a
// resume may change. Exit code 2 with the reason otherwise; 0 with *step set to the checkpoint's step.
int check_resume(const LoadedConfig& loaded, const std::string& run_dir, bool shared_reads, int64_t* step) {
  const std::string ckpts = run_dir + "/checkpoints";
  auto latest = learner::latest_checkpoint(ckpts);
  if (!latest.ok()) {
    std::fprintf(stderr, "troupe: error: --resume %s: %s\n", run_dir.c_str(), latest.error().message.c_str());
    return 2;
  }
  auto state = shared_reads ? learner::check_checkpoint_listing(*latest) : learner::verify_checkpoint(*latest);
  if (!state.ok()) return report_bad_checkpoint(run_dir, *latest, state.error().message);
  *step = (*state)["step"].get<int64_t>();
  const std::string stored = run_dir + "/config.resolved.yaml";
  if (!fs::exists(stored)) {
    std::fprintf(stderr, "troupe: warning: --resume %s: no config.resolved.yaml, the config is not compared\n",
                 run_dir.c_str());
    return 0;
  }
  auto before = load_config(stored);
  if (!before.ok()) {
    std::fprintf(stderr, "troupe: error: --resume %s: the run's own config does not load:\n%s\n", run_dir.c_str(),
                 before.error().message.c_str());
    return 2;
  }
  auto diffs = resume_conflicts(before->config, loaded.config);
  if (diffs.empty()) return 0;
  std::string lines;
  for (const auto& d : diffs) {
    lines += "  " + d.key + ": " + d.before + " (the run) -> " + d.now + " (" + loaded.file + " and --set)\n";
  }
  std::fprintf(stderr,
               "troupe: error: --resume %s: %zu key(s) differ from %s, and they change what the run trains:\n%s"
               "Resume with the run's YAML and --set flags (config.resolved.yaml lists every value it used), or start "
               "a new run.dir. A resume may change: %s\n",
               run_dir.c_str(), diffs.size(), stored.c_str(), lines.c_str(), resume_may_change_summary().c_str());
  return 2;
}

}  // namespace

int check_run_dir(const LoadedConfig& loaded, const RunOptions& opt, const std::string& run_dir,
                  bool shared_reads, int64_t* resume_after) {
  *resume_after = -1;  // the checkpoint's step: metric rows after it are dropped
  if (opt.resume_dir.empty() && fs::exists(run_dir + "/checkpoints/latest")) {
    auto m = loaded.mark_of("run.dir");
    std::fprintf(stderr,
                 "%s:%d:%d: error: run.dir: %s already holds a run; continue it with --resume %s or choose another "
                 "run.dir (--set run.dir=...)\n",
                 loaded.file.c_str(), m.first, m.second, run_dir.c_str(), run_dir.c_str());
    return 2;
  }
  if (!opt.resume_dir.empty() && !fs::exists(run_dir + "/checkpoints/latest")) {
    std::fprintf(stderr, "troupe: error: --resume %s: no checkpoints/latest in that run directory\n", run_dir.c_str());
    return 2;
  }
  if (!opt.resume_dir.empty()) return check_resume(loaded, run_dir, shared_reads, resume_after);
  return 0;
}

int verify_resume_shared(runtime::Cluster& cluster, const std::string& run_dir) {
  auto latest = learner::latest_checkpoint(run_dir + "/checkpoints");  // (check_run_dir found it)
  Status st = latest.ok() ? Status{} : Status(latest.error());
  const bool mpi = cluster.under_mpi();  // (without MPI this process reads every file)
  if (st.ok()) {
    auto part = learner::verify_checkpoint_part(*latest, mpi ? cluster.rank() : 0, mpi ? cluster.world_size() : 1);
    if (!part.ok()) st = part.error();
  }
  if (!st.ok())
    std::fprintf(stderr, "troupe: error: --resume %s: rank %d: %s\n", run_dir.c_str(), cluster.rank(),
                 st.error().message.c_str());
  int ok = st.ok() ? 1 : 0, all = ok;
  if (mpi) MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) return 0;
  if (cluster.rank() == 0)
    return report_bad_checkpoint(run_dir, latest.ok() ? *latest : run_dir + "/checkpoints/latest",
                                 "the checkpoint is not whole (the failing rank named the file above)");
  return 2;
}

}  // namespace troupe::launch::run
