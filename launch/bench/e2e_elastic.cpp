// `troupe bench e2e`, case elastic_join: the steps/s of one async GRPO run (the quickstart model,
// max_staleness 1, cluster.join) before and after two generators join it with `troupe join`. Every
// generator's sampling takes faults.generator_token_s per token (a sleep), so the generators, not
// this machine's cores, decide how fast rollouts come: three generators should give about three
// times the rollouts, as long as the learner keeps up. ours = steps/s after both joiners sampled
// (from the second step after their first work on), baseline = steps/s of the same run before the joins
// (skipping its first step); median of the runs' figures. Rows are counted by the metrics' step.
#include "e2e_elastic.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <omp.h>

#include "child_process.h"
#include "troupe/base/build_config.h"

namespace troupe::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kTokenS = 0.001;   // faults.generator_token_s: ~0.8 s of sampling per step for one generator
constexpr int kBeforeSteps = 8;     // steps timed before the joins (after the first)
constexpr int kAfterSteps = 12;     // steps timed after both joiners sampled
constexpr int kJoiners = 2;
constexpr int kRunTimeoutS = 300;

struct ElasticRun {
  double before = 0, after = 0;  // steps/s
  double gen_before = 0, gen_after = 0;  // mean generation seconds per step
  int first_work_step = -1;
};

struct Rows {
  std::vector<json> grpo;  // training rows, in order
};

Rows read_rows(const fs::path& dir) {
  Rows r;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object() && !j.contains("eval_accuracy") && j.value("phase", "") == "grpo") r.grpo.push_back(j);
  }
  return r;
}

// The step after which every joined generator has sampled (-1: not yet).
int joiners_working_after(const fs::path& dir) {
  std::ifstream in(dir / "members.json");
  auto j = json::parse(in, nullptr, false);
  if (!j.is_object()) return -1;
  int n = 0, last = -1;
  for (const auto& m : j.value("members", json::array()))
    if (m.contains("joined_step") && m.value("role", "") == "generator") {
      const int first = m.value("first_work_step", -1);
      if (first < 0) return -1;
      ++n;
      last = std::max(last, first);
    }
  return n == kJoiners ? last : -1;
}

// steps/s and mean gen_s over rows [from, to) (steps/s between the first and the last row's end).
std::pair<double, double> rate(const std::vector<json>& rows, size_t from, size_t to) {
  if (to <= from + 1) return {0, 0};
  const double t0 = rows[from]["wall_s"].get<double>(), t1 = rows[to - 1]["wall_s"].get<double>();
  double gen = 0;
  for (size_t i = from + 1; i < to; ++i) gen += rows[i].value("gen_s", 0.0);
  const double n = static_cast<double>(to - from - 1);
  return {n / std::max(1e-9, t1 - t0), gen / n};
}

void stop(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  for (int i = 0; i < 300; ++i) {  // 30 s, then SIGKILL
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// Waits (polling every 100 ms) until done() or the job exited or the run's deadline passed.
bool wait_until(pid_t job, std::chrono::steady_clock::time_point deadline, const std::function<bool()>& done) {
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    int status = 0;
    if (::waitpid(job, &status, WNOHANG) == job) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

std::optional<ElasticRun> run_elastic_once(int rep) {
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_elastic_" + std::to_string(getpid()) + "_" +
                                                    std::to_string(rep));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::string> job_args = {
      "run", std::string(TROUPE_SOURCE_DIR) + "/configs/quickstart.yaml", "--set", "run.dir=" + (dir / "run").string(),
      "--set", "sft.enabled=false", "--set", "grpo.max_steps=100000", "--set", "rollout.async=true", "--set",
      "rollout.max_staleness=1", "--set", "cluster.transport=tcp", "--set", "cluster.join=true", "--set",
      "faults.generator_token_s=" + std::to_string(kTokenS), "--set", "eval.every=0", "--set", "eval.num_prompts=8",
      "--set", "checkpointing.enabled=false", "--set", "logger.tensorboard=false", "--set", "logger.progress=off",
      "--set", "logger.trajectories=false"};
  std::string why;
  const pid_t job = spawn_troupe(job_args, (dir / "job.log").string(), &why);
  if (job < 0) {
    std::fprintf(stderr, "bench e2e: elastic_join: %s\n", why.c_str());
    return std::nullopt;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kRunTimeoutS);
  const fs::path run = dir / "run";
  std::vector<pid_t> joiners;
  std::optional<ElasticRun> out;
  int working_after = -1;
  bool ok = wait_until(job, deadline, [&] { return read_rows(run).grpo.size() >= kBeforeSteps + 1; });
  for (int i = 0; ok && i < kJoiners; ++i) {
    const pid_t p = spawn_troupe({"join", run.string(), "--role", "generator"},
                                 (dir / ("joiner" + std::to_string(i) + ".log")).string(), &why);
    ok = p > 0;
    if (ok) joiners.push_back(p);
  }
  ok = ok && wait_until(job, deadline, [&] { return (working_after = joiners_working_after(run)) >= 0; });
  // from the second step after every joiner's first work (async: the first may hold rollouts
  // sampled before it), kAfterSteps steps (and the one the rate starts at)
  auto after = [&](const json& j) { return j.value("step", 0) > working_after + 1; };
  auto after_rows = [&](const Rows& r) { return std::count_if(r.grpo.begin(), r.grpo.end(), after); };
  ok = ok && wait_until(job, deadline, [&] { return after_rows(read_rows(run)) >= kAfterSteps + 1; });
  for (pid_t p : joiners) stop(p);
  stop(job);
  if (ok) {
    const Rows r = read_rows(run);
    const size_t first_after = static_cast<size_t>(std::find_if(r.grpo.begin(), r.grpo.end(), after) - r.grpo.begin());
    ElasticRun e;
    std::tie(e.before, e.gen_before) = rate(r.grpo, 1, kBeforeSteps + 1);
    std::tie(e.after, e.gen_after) = rate(r.grpo, first_after, first_after + kAfterSteps + 1);
    e.first_work_step = working_after;
    out = e;
    fs::remove_all(dir);
  } else {
    std::fprintf(stderr, "bench e2e: elastic_join: the run did not get through its joins; logs in %s\n",
                 dir.c_str());
  }
  return out;
}

}  // namespace

int run_elastic_join(const BenchOptions& opt) {
  if (!opt.wants("elastic_join")) return 0;
  const int reps = std::max(5, opt.reps);  // (--quick too: one repetition is one run of about half a minute)
  std::vector<double> before, after, gen_before, gen_after;
  for (int r = 0; r < reps; ++r) {
    auto e = run_elastic_once(r);
    if (!e) return 1;
    before.push_back(e->before);
    after.push_back(e->after);
    gen_before.push_back(e->gen_before);
    gen_after.push_back(e->gen_after);
  }
  emit(make_row("e2e", "elastic_join", {"steps_per_s", "steps/s", Better::higher}, {median(after), median(before)},
                "the same run before the joins (1 generator)",
                {{"generators_before", 1},
                 {"generators_after", 1 + kJoiners},
                 {"generator_token_s", kTokenS},
                 {"rollout_async", true},
                 {"max_staleness", 1},
                 {"steps_timed_before", kBeforeSteps},
                 {"steps_timed_after", kAfterSteps},
                 {"generation_s_per_step_before", median(gen_before)},
                 {"generation_s_per_step_after", median(gen_after)},
                 {"reps", reps},
                 {"cores", omp_get_num_procs()}}));
  return 0;
}

}  // namespace troupe::bench
