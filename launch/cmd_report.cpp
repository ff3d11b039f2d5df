// `troupe report RUN_DIR`: writes RUN_DIR/report.png (reward and eval accuracy by step, the SFT
// loss, the sampler/learner mismatch and the frozen models' metrics (distill/*, reward_model/*,
// judge/parse_fail_frac, each scorer use's latency: scorer/latency_s, scorer/judge/latency_s,
// scorer/reward_model/latency_s and their _max_s; and its batch sizes, */batch_requests and
// */batch_requests_max) when the rows have them) with
// matplotlib, run through troupe::python_executable() (posix_spawn, no shell). A torn last line of
// metrics.jsonl (no newline: a run killed mid-write, or one writing now) is left out with a warning;
// any other line that is not a JSON object is an error naming FILE:LINE (exit 2).
#include <spawn.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "troupe/base/build_config.h"
#include "troupe/launch/commands.h"

extern char** environ;

namespace troupe::launch {
namespace {

// argv[1] = metrics.jsonl, argv[2] = output png
const char* kPlotScript = R"PY(
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = []
with open(sys.argv[1]) as f:
    lines = f.read().split("\n")
# the text after the last newline: empty, or a last line a killed run tore (it lacks its newline)
for n, line in enumerate(lines, 1):
    torn = n == len(lines)
    line = line.strip()
    if not line:
        continue
    try:
        row = json.loads(line)
        if not isinstance(row, dict):
            raise ValueError("a JSON " + type(row).__name__)
        rows.append(row)
    except ValueError as e:
        if torn:
            sys.stderr.write("%s:%d: warning: a torn last line (the run was killed while writing it, or is "
                             "writing it now); the line is left out\n" % (sys.argv[1], n))
            continue
        sys.stderr.write("%s:%d: error: not a JSON object: %s\n" % (sys.argv[1], n, e))
        sys.exit(2)
train = [r for r in rows if "eval_accuracy" not in r and "reward_mean" in r and r["reward_mean"] is not None]
sft = [r for r in rows if "eval_accuracy" not in r and r.get("phase") == "sft" and "loss" in r]
evals = [r for r in rows if "eval_accuracy" in r]
mism = [r for r in rows if "eval_accuracy" not in r and "logprob_diff_max" in r]
FROZEN = ("distill/reverse_kl", "distill/teacher_logprob_mean", "reward_model/score_mean", "judge/parse_fail_frac")
# each scorer use's request latency (teacher, local judge, reward model): mean and max seconds
LATENCY = (("scorer/", "tab:gray"), ("scorer/judge/", "tab:red"), ("scorer/reward_model/", "tab:olive"))
frozen = [r for r in rows if "eval_accuracy" not in r and
          any(k in r for k in FROZEN + tuple(p + "latency_s" for p, _ in LATENCY))]
batched = [r for r in frozen if any(p + "batch_requests" in r for p, _ in LATENCY)]
panels = 2 + (1 if sft else 0) + (1 if mism else 0) + (1 if frozen else 0) + (1 if batched else 0)
fig, axes = plt.subplots(1, panels, figsize=(4 + 3.7 * panels, 4))
ax = axes[0]
for phase, color in (("grpo", "tab:blue"), ("sft", "tab:gray")):
    pts = [(r["step"], r["reward_mean"]) for r in train if r.get("phase") == phase]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, label=phase + " reward_mean")
ax.set_xlabel("step"); ax.set_ylabel("reward"); ax.set_title("training reward"); ax.grid(alpha=0.3)
if train: ax.legend()
ax = axes[1]
for phase, marker in (("sft", "s"), ("grpo", "o")):
    pts = [(r["step"], r["eval_accuracy"]) for r in evals if r.get("phase") == phase]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=phase + " eval_accuracy")
ax.set_xlabel("step"); ax.set_ylabel("held-out accuracy (greedy)"); ax.set_ylim(-0.02, 1.02)
ax.set_title("evaluation"); ax.grid(alpha=0.3)
if evals: ax.legend()
if sft:
    ax = axes[2]
    ax.plot([r["step"] for r in sft], [r["loss"] for r in sft], color="tab:gray")
    ax.set_xlabel("step"); ax.set_ylabel("loss"); ax.set_title("SFT loss"); ax.grid(alpha=0.3)
if mism:
    ax = axes[-1]
    steps = [r["step"] for r in mism]
    for key, color in (("logprob_diff_max", "tab:red"), ("logprob_diff_mean", "tab:orange")):
        ax.plot(steps, [max(r[key], 1e-12) for r in mism], color=color, label=key)
    ax.set_yscale("log"); ax.set_xlabel("step"); ax.set_ylabel("|logp sampler - logp learner|")
    ax.set_title("sampler/learner mismatch"); ax.grid(alpha=0.3)
    if any("routing_agreement" in r for r in mism):
        ax2 = ax.twinx()
        pts = [(r["step"], r["routing_agreement"]) for r in mism if "routing_agreement" in r]
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], color="tab:green", label="routing_agreement")
        ax2.set_ylim(-0.02, 1.02); ax2.set_ylabel("routing agreement")
        ax2.legend(loc="lower right")
    ax.legend(loc="upper left")
if frozen:
    ax = axes[2 + (1 if sft else 0)]
    for key, color in zip(FROZEN, ("tab:purple", "tab:brown", "tab:olive", "tab:red")):
        pts = [(r["step"], r[key]) for r in frozen if key in r]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, label=key)
    pts = [(r["step"], r["reward_model/score_mean"], r.get("reward_model/score_std", 0.0))
           for r in frozen if "reward_model/score_mean" in r]
    if pts:
        ax.fill_between([p[0] for p in pts], [p[1] - p[2] for p in pts], [p[1] + p[2] for p in pts],
                        color="tab:olive", alpha=0.2, label="reward_model/score_std")
    ax.set_xlabel("step"); ax.set_title("frozen models (teacher, reward model, judge)"); ax.grid(alpha=0.3)
    ax2 = None
    for prefix, color in LATENCY:
        for key, style in ((prefix + "latency_s", "--"), (prefix + "latency_max_s", ":")):
            pts = [(r["step"], r[key]) for r in frozen if key in r]
            if pts:
                ax2 = ax2 or ax.twinx()
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], color=color, linestyle=style, label=key)
    if ax2:
        ax2.set_ylabel("scorer latency (s)"); ax2.legend(loc="lower right", fontsize="small")
    ax.legend(loc="upper left", fontsize="small")
if batched:  # each scorer use's batch size: the mean and the largest number of requests per scorer batch
    ax = axes[3 + (1 if sft else 0)]
    for prefix, color in LATENCY:
        for key, style in ((prefix + "batch_requests", "-"), (prefix + "batch_requests_max", ":")):
            pts = [(r["step"], r[key]) for r in batched if key in r]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, linestyle=style, label=key)
    ax.set_xlabel("step"); ax.set_ylabel("requests per scorer batch"); ax.set_title("scorer batches")
    ax.grid(alpha=0.3); ax.legend(loc="upper left", fontsize="small")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=100)
print(sys.argv[2])
)PY";

int run_report(const std::string& dir) {
  namespace fs = std::filesystem;
  std::string metrics = dir + "/metrics.jsonl";
  if (!fs::exists(metrics)) {
    std::fprintf(stderr, "troupe: error: %s: no metrics.jsonl in this run directory\n", dir.c_str());
    return 2;
  }
  std::string out = dir + "/report.png";
  std::string py = python_executable();
  std::vector<std::string> args = {py, "-c", kPlotScript, metrics, out};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, py.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "troupe: error: cannot start %s (set TROUPE_PYTHON to a Python with matplotlib)\n",
                 py.c_str());
    return 1;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "troupe: error: plotting %s failed (exit %d)\n", metrics.c_str(),
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return WIFEXITED(status) && WEXITSTATUS(status) == 2 ? 2 : 1;
  }
  return 0;
}

}  // namespace

Command add_report_command(CLI::App& root) {
  auto dir = std::make_shared<std::string>();
  auto* app = root.add_subcommand("report", "Plot reward and eval accuracy of a run to RUN_DIR/report.png");
  app->add_option("run_dir", *dir, "Run directory")->required();
  return {app, [dir]() { return run_report(*dir); }};
}

}  // namespace troupe::launch
