// `troupe bench e2e`: case async_vs_sync — the quickstart model's GRPO loop in async mode
// (max_staleness 1) vs sync mode, same process, interleaved runs, median of >= 5. Metric
// steps_per_s over the GRPO phase; extra fields give the per-step time breakdown of both modes
// (generation, env, learner, weight sync, generator idle, learner idle, core idle) and the share of
// each idle time async removes. Generator idle: no sampling work; learner idle: step time neither
// training nor syncing weights; idle = the two summed (what the goal counts); core idle: cores x wall - the
// process's CPU time, per step (the roles share the cores here, so a waiting role's cores are not always
// idle). Both modes run the same config (cluster.generator_nice 19: sampling yields to the learner); async
// streams each step to the learner in rollout.async_chunks parts, as configs/async.yaml does.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

#include <omp.h>

#include "bench.h"
#include "troupe/base/build_config.h"
#include "troupe/launch/config.h"
#include "troupe/launch/run.h"

namespace troupe::bench {
namespace {

constexpr int kGeneratorNice = 19;  // both modes: sampling yields to the learner
constexpr int kAsyncChunks = 4;     // async: parts per step streamed to the learner (configs/async.yaml)
namespace fs = std::filesystem;

struct Measured {
  double steps_per_s = 0;
  std::map<std::string, double> per_step;  // mean seconds per GRPO step
};

// One run of the quickstart's GRPO phase; nullopt-like (steps_per_s 0) on failure.
Measured run_once(bool async, int steps, int rep) {
  Measured m;
  std::string dir = (fs::temp_directory_path() / ("troupe_bench_e2e_" + std::to_string(getpid()) + "_" +
                                                  (async ? "async_" : "sync_") + std::to_string(rep)))
                        .string();
  fs::remove_all(dir);
  std::vector<std::string> sets = {"run.dir=" + dir,
                                   "sft.enabled=false",
                                   "grpo.max_steps=" + std::to_string(steps),
                                   "rollout.async=" + std::string(async ? "true" : "false"),
                                   "rollout.max_staleness=1",
                                   "eval.every=0",
                                   "eval.num_prompts=8",
                                   "checkpointing.enabled=false",
                                   "logger.tensorboard=false",
                                   "logger.progress=off",
                                   "logger.trajectories=false",
                                   "cluster.generator_nice=" + std::to_string(kGeneratorNice),
                                   "rollout.async_chunks=" + std::to_string(async ? kAsyncChunks : 1)};
  auto loaded = launch::load_config(std::string(TROUPE_SOURCE_DIR) + "/configs/quickstart.yaml", sets);
  if (!loaded.ok()) {
    std::fprintf(stderr, "bench e2e: %s\n", loaded.error().message.c_str());
    return m;
  }
  if (launch::run_experiment(*loaded, {}) != 0) return m;
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && !j.contains("eval_accuracy")) rows.push_back(j);
  }
  fs::remove_all(dir);
  if (rows.size() < 3) return m;
  // steps/s over the phase, skipping the first step (warm-up, and async's pipeline fill)
  double t0 = rows.front()["wall_s"].get<double>(), t1 = rows.back()["wall_s"].get<double>();
  m.steps_per_s = static_cast<double>(rows.size() - 1) / std::max(1e-9, t1 - t0);
  for (const char* k : {"gen_s", "env_s", "learner_s", "weight_sync_s", "idle_s", "learner_idle_s", "step_s"}) {
    double sum = 0;
    for (size_t i = 1; i < rows.size(); ++i) sum += rows[i].value(k, 0.0);
    m.per_step[k] = sum / static_cast<double>(rows.size() - 1);
  }
  m.per_step["idle_total_s"] = m.per_step["idle_s"] + m.per_step["learner_idle_s"];
  // cores x wall - the process's CPU time, over the same steps (metrics rows carry process_cpu_s)
  const double cpu_phase = rows.back().value("process_cpu_s", 0.0) - rows.front().value("process_cpu_s", 0.0);
  m.per_step["core_idle_s"] =
      std::max(0.0, (t1 - t0) * omp_get_num_procs() - cpu_phase) / static_cast<double>(rows.size() - 1);
  return m;
}

}  // namespace

int run_e2e_suite(const BenchOptions& opt) {
  if (!opt.wants("async_vs_sync")) return 0;
  int steps = opt.quick ? 12 : 30;
  int reps = std::max(5, opt.reps);
  std::vector<Measured> async_runs, sync_runs;
  for (int r = 0; r < reps; ++r) {  // interleaved: async, sync, async, sync, ...
    async_runs.push_back(run_once(true, steps, r));
    sync_runs.push_back(run_once(false, steps, r));
    if (async_runs.back().steps_per_s <= 0 || sync_runs.back().steps_per_s <= 0) {
      std::fprintf(stderr, "bench e2e: async_vs_sync: a run failed\n");
      return 1;
    }
  }
  auto med = [](const std::vector<Measured>& v, const std::string& key) {
    std::vector<double> x;
    for (const auto& m : v) x.push_back(key == "steps_per_s" ? m.steps_per_s : m.per_step.at(key));
    return median(x);
  };
  nlohmann::json bd_async, bd_sync;
  for (const char* k : {"gen_s", "env_s", "learner_s", "weight_sync_s", "idle_s", "learner_idle_s",
                        "idle_total_s", "core_idle_s", "step_s"}) {
    std::string name = std::string(k) == "gen_s" ? "generation_s" : std::string(k) == "idle_s" ? "generator_idle_s" : k;
    bd_async[name] = med(async_runs, k);
    bd_sync[name] = med(sync_runs, k);
  }
  // share of a breakdown entry that async removes
  auto removed = [&](const char* key) {
    const double sync = bd_sync[key].get<double>(), async = bd_async[key].get<double>();
    return sync > 0 ? 1.0 - async / sync : 0.0;
  };
  emit(make_row("e2e", "async_vs_sync", {"steps_per_s", "steps/s", Better::higher},
                {med(async_runs, "steps_per_s"), med(sync_runs, "steps_per_s")}, "sync",
                {{"max_staleness", 1},
                 {"grpo_steps_per_run", steps},
                 {"reps", reps},
                 {"breakdown_async_per_step", bd_async},
                 {"breakdown_sync_per_step", bd_sync},
                 {"generator_idle_removed_frac", removed("generator_idle_s")},
                 {"learner_idle_removed_frac", removed("learner_idle_s")},
                 {"idle_removed_frac", removed("idle_total_s")},
                 {"core_idle_removed_frac", removed("core_idle_s")},
                 {"cores", omp_get_num_procs()},
                 {"generator_nice", kGeneratorNice},
                 {"async_chunks", kAsyncChunks}}));
  return 0;
}

}  // namespace troupe::bench
