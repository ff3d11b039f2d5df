// Step 4 of `troupe run`: the run directory before anything is written. A new run's run.dir holds no
// run; `--resume RUN_DIR` has a whole checkpoints/latest and the run's own config.resolved.yaml up to
// the keys a resume may change (every rank checks; errors exit 2 and change nothing).
#include <cstdio>
#include <filesystem>

#include "run/steps.h"
#include "troupe/learner/checkpoint.h"

namespace troupe::launch::run {
namespace fs = std::filesystem;

namespace {

// Before a --resume touches the run directory (every rank checks, nothing is written): the
// checkpoint it continues from is whole, and the config is the run's own (config.resolved.yaml)
// up to the keys a resume may change. Exit code 2 with the reason otherwise; 0 with *step set to
// the checkpoint's step.
int check_resume(const LoadedConfig& loaded, const std::string& run_dir, int64_t* step) {
  const std::string ckpts = run_dir + "/checkpoints";
  auto latest = learner::latest_checkpoint(ckpts);
  if (!latest.ok()) {
    std::fprintf(stderr, "troupe: error: --resume %s: %s\n", run_dir.c_str(), latest.error().message.c_str());
    return 2;
  }
  auto state = learner::verify_checkpoint(*latest);
  if (!state.ok()) {
    // Name the earlier checkpoints that are whole, newest first: the run can go on from one of them.
    const auto steps = learner::checkpoint_steps(ckpts);
    std::error_code ec;
    std::string whole;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const std::string dir = ckpts + "/" + it->second;
      if (!fs::equivalent(dir, *latest, ec) && learner::verify_checkpoint(dir).ok())
        whole += (whole.empty() ? "" : ", ") + it->second;
    }
    std::fprintf(stderr,
                 "troupe: error: --resume %s: %s; nothing in the run directory was changed. %s\n", run_dir.c_str(),
                 state.error().message.c_str(),
                 whole.empty() ? "No earlier checkpoint is whole either."
                               : ("Earlier checkpoints that are whole: " + whole + "; to go on from the newest: ln -sfn " +
                                  whole.substr(0, whole.find(',')) + " " + ckpts + "/latest")
                                     .c_str());
    return 2;
  }
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
                  int64_t* resume_after) {
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
  if (!opt.resume_dir.empty()) return check_resume(loaded, run_dir, resume_after);
  return 0;
}

}  // namespace troupe::launch::run
