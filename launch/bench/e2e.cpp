// `troupe bench e2e`: case async_vs_sync — the quickstart model's GRPO loop in async mode
// (max_staleness 1) vs sync mode, same process, interleaved runs, median of >= 5. Metric
// steps_per_s over the GRPO phase; extra fields give the per-step time breakdown of both modes
// (generation, env, learner, weight sync, generator idle, learner idle, core idle) and the share of
// each idle time async removes. Generator idle: no sampling work; learner idle: step time neither
// training nor syncing weights; idle = the two summed (what the goal counts); core idle: cores x wall - the
// process's CPU time, per step (the roles share the cores here, so a waiting role's cores are not always
// idle). Both modes run the same config (cluster.generator_nice 19: sampling yields to the learner); async
// streams each step to the learner in rollout.async_chunks parts, as configs/async.yaml does.
// Cases in_flight_vs_staleness1/2 and in_flight_lag2_vs_staleness1/2 (one set of interleaved runs):
// async with in-flight weight updates (max_staleness 2, a switch every kInFlightEvery decode steps;
// rollout.in_flight_min_lag 1, and 2) vs async without them at max_staleness 1 and 2, all unstreamed
// (async_chunks 1, which in-flight updates need): steps/s, idle, and the mean staleness of the
// trained tokens.
// Case elastic_join (e2e_elastic.cpp): steps/s of one async run before and after two generators join.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <unistd.h>

#include <omp.h>

#include "e2e_elastic.h"
#include "troupe/bench/bench.h"
#include "troupe/base/build_config.h"
#include "troupe/launch/config.h"
#include "troupe/launch/run.h"

namespace troupe::bench {
namespace {

constexpr int kGeneratorNice = 19;  // both modes: sampling yields to the learner
constexpr int kAsyncChunks = 4;     // async: parts per step streamed to the learner (configs/async.yaml)
constexpr int kInFlightEvery = 2;   // in-flight: decode steps between switches (the quickstart samples <= 6 tokens)
namespace fs = std::filesystem;

struct Measured {
  double steps_per_s = 0;
  std::map<std::string, double> per_step;  // mean seconds per GRPO step
};

struct Mode {
  bool async = false;
  int staleness = 1;
  int chunks = 1;
  bool in_flight = false;
  int min_lag = 1;
  std::string name() const {
    return async ? "async" + std::to_string(staleness) + (in_flight ? "_inflight" + std::to_string(min_lag) : "")
                 : "sync";
  }
};

// One run of the quickstart's GRPO phase; nullopt-like (steps_per_s 0) on failure.
Measured run_once(const Mode& mode, int steps, int rep) {
  Measured m;
  std::string dir = (fs::temp_directory_path() / ("troupe_bench_e2e_" + std::to_string(getpid()) + "_" +
                                                  mode.name() + "_" + std::to_string(rep)))
                        .string();
  fs::remove_all(dir);
  std::vector<std::string> sets = {"run.dir=" + dir,
                                   "sft.enabled=false",
                                   "grpo.max_steps=" + std::to_string(steps),
                                   "rollout.async=" + std::string(mode.async ? "true" : "false"),
                                   "rollout.max_staleness=" + std::to_string(mode.staleness),
                                   "eval.every=0",
                                   "eval.num_prompts=8",
                                   "checkpointing.enabled=false",
                                   "logger.tensorboard=false",
                                   "logger.progress=off",
                                   "logger.trajectories=false",
                                   "cluster.generator_nice=" + std::to_string(kGeneratorNice),
                                   "rollout.async_chunks=" + std::to_string(mode.chunks)};
  if (mode.in_flight) {
    sets.push_back("rollout.in_flight_updates=true");
    sets.push_back("rollout.in_flight_every=" + std::to_string(kInFlightEvery));
    sets.push_back("rollout.in_flight_min_lag=" + std::to_string(mode.min_lag));
  }
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
  {  // the trained tokens' lag behind the learners (without in-flight updates: the rollout's)
    double sum = 0;
    for (size_t i = 1; i < rows.size(); ++i)
      sum += rows[i].value("token_staleness_mean", rows[i].value("staleness", 0.0));
    m.per_step["token_staleness_mean"] = sum / static_cast<double>(rows.size() - 1);
  }
  // cores x wall - the process's CPU time, over the same steps (metrics rows carry process_cpu_s)
  const double cpu_phase = rows.back().value("process_cpu_s", 0.0) - rows.front().value("process_cpu_s", 0.0);
  m.per_step["core_idle_s"] =
      std::max(0.0, (t1 - t0) * omp_get_num_procs() - cpu_phase) / static_cast<double>(rows.size() - 1);
  return m;
}

double med(const std::vector<Measured>& v, const std::string& key) {
  std::vector<double> x;
  for (const auto& m : v) x.push_back(key == "steps_per_s" ? m.steps_per_s : m.per_step.at(key));
  return median(x);
}

// The median per-step figures `keys` of a mode's runs, as a row reports them (gen_s is
// generation_s, idle_s generator_idle_s).
nlohmann::json breakdown(const std::vector<Measured>& v, std::initializer_list<const char*> keys) {
  nlohmann::json bd;
  for (const char* k : keys) {
    const std::string key = k;
    bd[key == "gen_s" ? "generation_s" : key == "idle_s" ? "generator_idle_s" : key] = med(v, key);
  }
  return bd;
}

// In-flight updates (max_staleness 2; min_lag 1 and 2) vs async without them at max_staleness 1 and 2.
int run_in_flight(const BenchOptions& opt) {
  struct Case {
    const char* name;
    int ours;  // index into modes
    int base;
  };
  const std::vector<Case> cases = {{"in_flight_vs_staleness1", 0, 2},
                                   {"in_flight_vs_staleness2", 0, 3},
                                   {"in_flight_lag2_vs_staleness1", 1, 2},
                                   {"in_flight_lag2_vs_staleness2", 1, 3}};
  const std::vector<Mode> modes = {{true, 2, 1, true, 1}, {true, 2, 1, true, 2}, {true, 1, 1, false, 1},
                                   {true, 2, 1, false, 1}};
  std::vector<char> needed(modes.size(), 0);
  bool any = false;
  for (const auto& c : cases)
    if (opt.wants(c.name)) needed[static_cast<size_t>(c.ours)] = needed[static_cast<size_t>(c.base)] = 1, any = true;
  if (!any) return 0;
  const int steps = opt.quick ? 12 : 30;
  const int reps = std::max(5, opt.reps);
  std::vector<std::vector<Measured>> runs(modes.size());
  for (int r = 0; r < reps; ++r)  // interleaved, the first one rotating
    for (size_t i = 0; i < modes.size(); ++i) {
      const size_t m = (static_cast<size_t>(r) + i) % modes.size();
      if (!needed[m]) continue;
      runs[m].push_back(run_once(modes[m], steps, r));
      if (runs[m].back().steps_per_s <= 0) {
        std::fprintf(stderr, "bench e2e: in_flight: a run (%s) failed\n", modes[m].name().c_str());
        return 1;
      }
    }
  auto in_flight_breakdown = [](const std::vector<Measured>& v) {
    return breakdown(v, {"gen_s", "learner_s", "weight_sync_s", "idle_s", "learner_idle_s", "idle_total_s", "step_s",
                         "token_staleness_mean"});
  };
  for (const auto& c : cases) {
    if (!opt.wants(c.name)) continue;
    const auto& ours = runs[static_cast<size_t>(c.ours)];
    const auto& base = runs[static_cast<size_t>(c.base)];
    const Mode& mb = modes[static_cast<size_t>(c.base)];
    const nlohmann::json bd_ours = in_flight_breakdown(ours), bd_base = in_flight_breakdown(base);
    const double idle_base = bd_base["idle_total_s"].get<double>(), idle_ours = bd_ours["idle_total_s"].get<double>();
    emit(make_row("e2e", c.name, {"steps_per_s", "steps/s", Better::higher},
                  {med(ours, "steps_per_s"), med(base, "steps_per_s")},
                  "async max_staleness " + std::to_string(mb.staleness) + " without in-flight updates",
                  {{"max_staleness", 2},
                   {"in_flight_min_lag", modes[static_cast<size_t>(c.ours)].min_lag},
                   {"baseline_max_staleness", mb.staleness},
                   {"in_flight_every", kInFlightEvery},
                   {"grpo_steps_per_run", steps},
                   {"reps", reps},
                   {"idle_total_s", idle_ours},
                   {"baseline_idle_total_s", idle_base},
                   {"idle_removed_frac", idle_base > 0 ? 1.0 - idle_ours / idle_base : 0.0},
                   {"token_staleness_mean", bd_ours["token_staleness_mean"]},
                   {"baseline_token_staleness_mean", bd_base["token_staleness_mean"]},
                   {"breakdown_per_step", bd_ours},
                   {"breakdown_baseline_per_step", bd_base},
                   {"cores", omp_get_num_procs()},
                   {"generator_nice", kGeneratorNice},
                   {"async_chunks", 1}}));
  }
  return 0;
}

}  // namespace

int run_e2e_suite(const BenchOptions& opt) {
  if (int rc = run_in_flight(opt); rc != 0) return rc;
  if (int rc = run_elastic_join(opt); rc != 0) return rc;
  if (!opt.wants("async_vs_sync")) return 0;
  int steps = opt.quick ? 12 : 30;
  int reps = std::max(5, opt.reps);
  std::vector<Measured> async_runs, sync_runs;
  const Mode async{true, 1, kAsyncChunks, false}, sync{};
  for (int r = 0; r < reps; ++r) {  // interleaved: async, sync, async, sync, ...
    async_runs.push_back(run_once(async, steps, r));
    sync_runs.push_back(run_once(sync, steps, r));
    if (async_runs.back().steps_per_s <= 0 || sync_runs.back().steps_per_s <= 0) {
      std::fprintf(stderr, "bench e2e: async_vs_sync: a run failed\n");
      return 1;
    }
  }
  const auto keys = {"gen_s", "env_s", "learner_s", "weight_sync_s", "idle_s", "learner_idle_s",
                     "idle_total_s", "core_idle_s", "step_s"};
  const nlohmann::json bd_async = breakdown(async_runs, keys), bd_sync = breakdown(sync_runs, keys);
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
