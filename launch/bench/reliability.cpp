// `troupe bench reliability`: one row per fault kind of the faults: section. Each case runs a tiny
// GRPO job (the quickstart's model shrunk, arithmetic in an isolated env worker, 3 steps of
// 8 prompts x 4 samples, a checkpoint every step) as a child `troupe run` with that fault
// injected, and once without faults (the baseline). The row's figure is the episodes trained
// against the fault-free run's (ratio 1 = nothing lost), with the integer fields
//   faults_injected         "troupe: fault injected" lines the child printed
//   survived                1 when the faulted job finished all its steps (after a --resume for
//                           the kinds that kill the process)
//   episodes_lost           episodes of the finished steps that were not trained (failed after
//                           retries, or lost with a process)
//   episodes_trained_twice  episodes of steps whose metrics row appears twice
//   resumes_bit_identical   1 when a run cut after step 2 (or killed by the fault) and resumed
//                           gives the uninterrupted faulted run's metrics bit for bit
// Cases with a `mode` (async, two generators, evaluation, a dataset env) run their own fault-free job
// as the reference. A case whose failures are no injected fault (an oversized env reply) counts the
// env calls that failed (the training rows' env_retries + env_failures) as faults_injected. The
// eval case adds
//   eval_env_retries        eval episodes' env calls retried (summed over the eval rows)
//   eval_env_failures       eval episodes that failed after retries (counted, left out of the means)
//   eval_bit_identical      1 when every eval row equals the fault-free run's
// The served-endpoint case (reliability_serve.cpp) is of another kind: requests, not episodes.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "child_process.h"
#include "reliability_serve.h"
#include "troupe/bench/bench.h"

namespace troupe::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSuite = "reliability";
constexpr int kSteps = 3, kPrompts = 8, kSamples = 4;

constexpr const char* kConfig = R"(run:
  seed: 5
policy:
  tokenizer: char
  model:
    family: qwen3_moe
    vocab_size: 100
    hidden_size: 32
    num_hidden_layers: 1
    num_attention_heads: 2
    num_key_value_heads: 1
    head_dim: 16
    intermediate_size: 32
    num_experts: 2
    num_experts_per_tok: 1
    moe_intermediate_size: 16
    max_position_embeddings: 64
sft:
  enabled: false
grpo:
  max_steps: 3
optimizer:
  schedule: constant
envs:
  - name: arithmetic
    isolate: true
    timeout_s: 1
rollout:
  max_prompt_length: 16
  max_response_length: 4
  num_generations: 4
  prompts_per_step: 8
eval:
  every: 0
  num_prompts: 4
checkpointing:
  enabled: true
  every: 1
  keep_last: 5
logger:
  tensorboard: false
  progress: off
  trajectories: false
)";

struct Child {
  int exit_code = -1;
  std::string err;
};

// Runs `troupe ARGS...` (this binary) with stdout/stderr to files; waits for it.
Child run_troupe(const std::vector<std::string>& args, const fs::path& log) {
  Child c;
  const pid_t pid = spawn_troupe(args, log.string(), &c.err);
  if (pid < 0) return c;
  int status = 0;
  waitpid(pid, &status, 0);
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  c.err = ss.str();
  return c;
}

int count_lines_with(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// The GRPO training rows of a run directory, in file order.
std::vector<json> training_rows(const fs::path& dir) {
  std::vector<json> rows;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    json r = json::parse(line, nullptr, false);
    if (r.is_object() && r.value("phase", "") == "grpo" && r.contains("reward_mean") && !r.contains("eval_accuracy"))
      rows.push_back(std::move(r));
  }
  return rows;
}

// The eval rows of a run directory, in file order.
std::vector<json> eval_rows(const fs::path& dir) {
  std::vector<json> rows;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    json r = json::parse(line, nullptr, false);
    if (r.is_object() && r.contains("eval_accuracy")) rows.push_back(std::move(r));
  }
  return rows;
}

// Same non-timing figures, step for step (skip_prefix: fields left out, e.g. the eval's failure counts).
bool same_metrics(const std::vector<json>& a, const std::vector<json>& b, const std::string& skip_prefix = "") {
  if (a.size() != b.size() || a.empty()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    for (const auto& [k, v] : a[i].items()) {
      if (k.ends_with("_s") || k.ends_with("batch_requests") || k.ends_with("batch_requests_max")) continue;  // timing
      if (!skip_prefix.empty() && k.starts_with(skip_prefix)) continue;
      if (!b[i].contains(k) || b[i][k] != v) return false;
    }
  return true;
}

// eval_env_retries and the eval_env_failures/<reason> counts, summed over the eval rows.
std::pair<int64_t, int64_t> eval_failure_counts(const std::vector<json>& rows) {
  int64_t retries = 0, failures = 0;
  for (const auto& r : rows)
    for (const auto& [k, v] : r.items()) {
      if (!v.is_number()) continue;
      if (k == "eval_env_retries") retries += v.get<int64_t>();
      else if (k.starts_with("eval_env_failures/")) failures += v.get<int64_t>();
    }
  return {retries, failures};
}

struct Tally {
  int trained = 0, twice = 0, steps = 0, failed_calls = 0;
};

Tally tally(const std::vector<json>& rows) {
  Tally t;
  std::map<int64_t, int> seen;
  for (const auto& r : rows) {
    const int n = r.value("groups_kept", 0) * kSamples - r.value("env_failures", 0);
    if (seen[r.value("step", int64_t{0})]++ > 0) {
      t.twice += n;
    } else {
      t.trained += n, ++t.steps;
      t.failed_calls += r.value("env_retries", 0) + r.value("env_failures", 0);
    }
  }
  return t;
}

struct Case {
  std::string name;
  std::vector<std::string> faults;  // --set arguments
  bool kills = false;               // the fault ends the process: finish with --resume
  std::string off;                  // what turns it off for the resume
  std::vector<std::string> mode;    // --set arguments of the job itself (its fault-free run too)
  bool eval = false;                 // add the eval figures
  bool failures_are_faults = false;  // faults_injected: failed env calls (env_retries + env_failures)
};

// The dataset env of the oversized-reply case: 40 train rows, every 8th with a 2 KiB field the env
// puts into its reset reply's metadata (over a 1024-byte max_message_bytes), and 4 eval rows.
std::vector<std::string> write_oversized_dataset(const fs::path& root) {
  std::ofstream train(root / "train.jsonl"), eval(root / "eval.jsonl");
  for (int i = 0; i < 40; ++i) {
    json row = {{"question", std::to_string(i % 10) + "+" + std::to_string(i / 10) + "="},
                {"answer", std::to_string(i % 10 + i / 10)}};
    if (i % 8 == 3) row["notes"] = std::string(2048, 'n');
    train << row.dump() << "\n";
  }
  for (int i = 0; i < 4; ++i)
    eval << json{{"question", "9+" + std::to_string(i) + "="}, {"answer", std::to_string(9 + i)}}.dump() << "\n";
  const json config = {{"train", (root / "train.jsonl").string()}, {"eval", (root / "eval.jsonl").string()},
                       {"verifier", "numeric"}, {"extract", "last_number"}};
  return {"--set", "envs[0].name=data", "--set", "envs[0].env=dataset", "--set", "envs[0].config=" + config.dump()};
}

struct Paths {
  fs::path root, cfg;
  std::vector<std::string> run(const fs::path& dir, std::vector<std::string> extra) const {
    std::vector<std::string> a = {"run", cfg.string(), "--set", "run.dir=" + dir.string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::vector<std::string> resume(const fs::path& dir, std::vector<std::string> extra) const {
    std::vector<std::string> a = {"run", cfg.string(), "--resume", dir.string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

// One case: the faulted job, then its resume (kinds that kill) or the same job cut after step 2
// and resumed; prints the row. Returns false when the faulted job did not survive.
bool run_case(const Case& c, const Paths& p, const Tally& base) {
  const fs::path& root = p.root;
  const fs::path full = root / (c.name + "_full"), cut = root / (c.name + "_cut");
  fs::path reference = root / "clean";
  Tally ref_tally = base;
  std::vector<std::string> faults = c.mode;
  faults.insert(faults.end(), c.faults.begin(), c.faults.end());
  if (!c.mode.empty()) {  // its own fault-free run
    reference = root / (c.name + "_clean");
    Child ref = run_troupe(p.run(reference, c.mode), root / (c.name + "_clean.log"));
    if (ref.exit_code != 0)
      std::fprintf(stderr, "troupe bench reliability: %s: the fault-free run failed (exit %d)\n", c.name.c_str(),
                   ref.exit_code);
    ref_tally = tally(training_rows(reference));
  }
  Child a = run_troupe(p.run(full, faults), root / (c.name + "_full.log"));
  int injected = count_lines_with(a.err, "troupe: fault injected:");
  bool survived = a.exit_code == 0;
  bool identical = false;
  std::vector<json> rows;
  if (c.kills) {
    // killed by the fault; going on from the last whole checkpoint must give the fault-free run
    std::vector<std::string> off = faults;
    off.back() = c.off;
    Child r = run_troupe(p.resume(full, off), root / (c.name + "_resume.log"));
    survived = a.exit_code != 0 && r.exit_code == 0;
    rows = training_rows(full);
    identical = survived && same_metrics(rows, training_rows(reference));
    if (r.exit_code != 0)
      std::fprintf(stderr, "troupe bench reliability: %s: the resume failed (exit %d):\n%s\n", c.name.c_str(),
                   r.exit_code, r.err.c_str());
  } else {
    // the same faulted job cut after step 2 and resumed: the fault draws follow the config alone
    std::vector<std::string> half = faults;
    half.insert(half.end(), {"--set", "grpo.max_steps=2"});
    Child h = run_troupe(p.run(cut, half), root / (c.name + "_cut.log"));
    Child r = run_troupe(p.resume(cut, faults), root / (c.name + "_cutresume.log"));
    rows = training_rows(full);
    identical = h.exit_code == 0 && r.exit_code == 0 && same_metrics(rows, training_rows(cut));
  }
  if (!survived)
    std::fprintf(stderr, "troupe bench reliability: %s: the faulted run failed (exit %d):\n%s\n", c.name.c_str(),
                 a.exit_code, a.err.substr(a.err.size() > 4000 ? a.err.size() - 4000 : 0).c_str());
  const Tally t = tally(rows);
  if (c.failures_are_faults) injected = t.failed_calls;
  const int lost = std::max(0, kSteps * kPrompts * kSamples - t.trained);
  json extra = {{"faults_injected", injected},
                {"survived", survived ? 1 : 0},
                {"episodes_lost", lost},
                {"episodes_trained_twice", t.twice},
                {"resumes_bit_identical", identical ? 1 : 0},
                {"steps", t.steps}};
  if (c.eval) {
    const auto evals = eval_rows(full);
    const auto [retries, failures] = eval_failure_counts(evals);
    extra["eval_env_retries"] = retries;
    extra["eval_env_failures"] = failures;
    extra["eval_bit_identical"] = same_metrics(evals, eval_rows(reference), "eval_env_") ? 1 : 0;
  }
  emit(make_row(kSuite, c.name, {"episodes_trained", "episodes", Better::higher},
                {static_cast<double>(t.trained), static_cast<double>(ref_tally.trained)}, "fault_free", extra));
  return survived;
}

}  // namespace

int run_reliability_suite(const BenchOptions& opt) {
  const fs::path root = fs::temp_directory_path() / ("troupe-bench-reliability-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(root, ec);
  fs::create_directories(root);
  const Paths paths{root, root / "tiny.yaml"};
  std::ofstream(paths.cfg) << kConfig;

  const std::vector<std::string> eval_mode = {"--set", "eval.at_start=true", "--set", "eval.every=1",
                                              "--set", "eval.num_prompts=8"};

  std::vector<Case> cases = {
      {"env_exception", {"--set", "faults.env_exception=0.1"}, false, "", {}},
      {"env_crash", {"--set", "faults.env_crash=0.05"}, false, "", {}},
      {"env_hang", {"--set", "faults.env_hang=0.03"}, false, "", {}},
      {"env_slow", {"--set", "faults.env_slow=0.1", "--set", "faults.env_slow_s=0.02"}, false, "", {}},
      {"env_malformed", {"--set", "faults.env_malformed=0.1"}, false, "", {}},
      {"env_drop", {"--set", "faults.env_drop=0.05"}, false, "", {}},
      {"learner_death", {"--set", "faults.learner_death_step=2"}, true, "faults.learner_death_step=0", {}},
      {"checkpoint_interrupt", {"--set", "faults.checkpoint_interrupt_step=2"}, true, "faults.checkpoint_interrupt_step=0", {}},
      // one process, two generators: generator 1's thread dies as step 2 is sampled, generator 0 takes its prompts
      {"generator_death",
       {"--set", "faults.generator_death_step=2"},
       false,
       "",
       {"--set", "cluster.generators=2", "--set", "faults.generator_death_rank=1"}},
      // async (max_staleness 2): the checkpoint holds the finished rollouts of the next two steps
      {"learner_death_async",
       {"--set", "faults.learner_death_step=3"},
       true,
       "faults.learner_death_step=0",
       {"--set", "rollout.async=true", "--set", "rollout.max_staleness=2"}},
      // an eval before step 1 and after every step, a quarter of all verifies failing: retried on the
      // next worker, the eval's figures those of the fault-free run
      {"eval_env_exception", {"--set", "faults.env_exception=0.25", "--set", "faults.env_op=verify"}, false, "",
       eval_mode, true},
      // a dataset env whose every 8th row makes a reset reply over max_message_bytes 1024: libzmq drops
      // it with its connection, the reset times out (1 s), the worker is replaced and the reset
      // retried with a new seed; the fault-free run has the default limit (64 MiB)
      {"env_oversized_reply", {"--set", "envs[0].max_message_bytes=1024"}, false, "", write_oversized_dataset(root),
       false, true},
  };
  int rc = 0;
  if (opt.wants("serve_overload") && run_serve_overload_case(opt) != 0) rc = 1;
  if (std::none_of(cases.begin(), cases.end(), [&](const Case& c) { return opt.wants(c.name); })) {
    fs::remove_all(root, ec);
    return rc;
  }
  Child clean = run_troupe(paths.run(root / "clean", {}), root / "clean.log");
  if (clean.exit_code != 0) {
    std::fprintf(stderr, "troupe bench reliability: the fault-free run failed (exit %d):\n%s\n", clean.exit_code,
                 clean.err.c_str());
    return 1;
  }
  const Tally base = tally(training_rows(root / "clean"));
  for (const auto& c : cases)
    if (opt.wants(c.name) && !run_case(c, paths, base)) rc = 1;
  fs::remove_all(root, ec);
  return rc;
}

}  // namespace troupe::bench
