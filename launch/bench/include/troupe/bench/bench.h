// `troupe bench SUITE`: shared measurement and output helpers for every suite.
// Output contract (docs/architecture.md): one JSON object per line on stdout,
//   {"suite","case","metric","unit","ours","baseline","baseline_name","ratio", ...extra}
// ratio > 1 always means ours is better; each figure is the median of >= 5 repetitions,
// ours and the baseline interleaved in the same process run. --quick shortens repetitions,
// never drops a case. A baseline that cannot run prints no row and says why on stderr.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace troupe::bench {

struct BenchOptions {
  bool quick = false;
  int reps = 5;              // repetitions per figure (>= 5 always)
  std::string filter;        // substring of case names to run ("" = all)
  bool wants(const std::string& case_name) const {
    return filter.empty() || case_name.find(filter) != std::string::npos;
  }
};

enum class Better { higher, lower };  // is a bigger figure better (throughput) or worse (time)?

// A figure of ours and the baseline's same figure (e.g. the two medians interleaved() returns).
struct Paired {
  double ours = 0;
  double baseline = 0;
};

// One printed row; suites make it with make_row() below.
struct Row {
  std::string suite;
  std::string case_name;
  std::string metric;
  std::string unit;
  double ours = 0;
  double baseline = 0;
  std::string baseline_name;
  Better better = Better::higher;
  nlohmann::json extra = nlohmann::json::object();  // extra figures, merged into the row
};

// What a figure is: its name (the row's "metric"), its unit and which way is better,
// e.g. {"step_ms", "ms", Better::lower}.
struct Metric {
  std::string name;
  std::string unit;
  Better better;
};

// The one way a suite makes a row: `figures.ours` against `figures.baseline` (the baseline named
// `baseline_name`) for one case of a suite, with extra figures merged into the printed object.
Row make_row(const std::string& suite, const std::string& case_name, const Metric& metric, const Paired& figures,
             const std::string& baseline_name, nlohmann::json extra = nlohmann::json::object());

// ratio > 1 means ours is better: higher-is-better -> ours/baseline; lower-is-better -> baseline/ours.
double ratio_of(const Row& row);
// Prints the row as one JSON line on stdout and flushes.
void emit(const Row& row);
// Says on stderr why a baseline row is absent.
void skip_baseline(const std::string& suite, const std::string& case_name, const std::string& why);

double median(std::vector<double> values);

// Runs ours() and baseline() alternately `reps` times (each returns one figure, e.g. seconds or
// msgs/s) and returns the two medians.
Paired interleaved(int reps, const std::function<double()>& ours, const std::function<double()>& baseline);

// interleaved() for any number of repetitions (>= 1): the rows whose one repetition takes
// minutes (the SmolLM2-sized rows) use fewer than 5 under --quick and say so in a "reps" field.
Paired interleaved_n(int reps, const std::function<double()>& ours, const std::function<double()>& baseline);

// Wall-clock seconds of fn().
double time_s(const std::function<void()>& fn);
// Milliseconds on the steady clock (the rank helpers time their steps with it).
double now_ms();

// Suites, one file each under launch/bench/. Each returns a process exit code.
int run_runtime_suite(const BenchOptions& opt);   // runtime.cpp
int run_policy_suite(const BenchOptions& opt);    // policy.cpp
int run_kernels_suite(const BenchOptions& opt);   // kernels.cpp
int run_envs_suite(const BenchOptions& opt);      // envs.cpp
int run_learner_suite(const BenchOptions& opt);   // learner.cpp
int run_e2e_suite(const BenchOptions& opt);       // e2e.cpp
int run_reliability_suite(const BenchOptions& opt);  // reliability.cpp
int run_weight_sync_suite(const BenchOptions& opt);  // weight_sync.cpp (mpirun on troupe_weight_sync_bench)
int run_scale_suite(const BenchOptions& opt);        // scale.cpp (the coordinator against simulated roles)

}  // namespace troupe::bench
