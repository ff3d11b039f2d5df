// `troupe bench envs`: episodes per second of a built-in env (arithmetic: reset + step + release)
// called three ways: in-process (episodes_inprocess), through an isolated env worker process over
// ipc (episodes_actor_ipc) and through the Python SDK server (episodes_python_sdk). The last two
// are measured interleaved with the in-process path, which is their baseline; each row also says
// the per-call overhead (microseconds per env call above the in-process cost). Also
// openai_serve_concurrent64 (openai_serve.cpp) and verifiers_zmq (verifiers_zmq.cpp).
#include <algorithm>
#include <cstdio>

#include "troupe/bench/bench.h"
#include "nemo_gym_http.h"
#include "openai_serve.h"
#include "verifiers_zmq.h"
#include "troupe/base/build_config.h"
#include "troupe/envs/client.h"

namespace troupe::bench {

namespace {

using envs::json;

constexpr int kCallsPerEpisode = 3;  // reset, step, release

// Runs n episodes on the client; returns episodes per second (0 on an env error, reported once).
double run_episodes(envs::EnvClient& c, int n, bool& failed) {
  std::string error;
  static const std::string ids[8] = {"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"};
  double s = time_s([&] {
    for (int i = 0; i < n && error.empty(); ++i) {
      const std::string& id = ids[i % 8];
      auto obs = c.reset(id, static_cast<uint64_t>(i), {});
      if (!obs.ok()) {
        error = obs.error().message;
        break;
      }
      auto step = c.step(id, obs->metadata["answer"].get<std::string>());
      if (!step.ok() || step->reward != 1.0) error = step.ok() ? "wrong reward" : step.error().message;
      c.release(id);
    }
  });
  if (!error.empty()) {
    if (!failed) std::fprintf(stderr, "troupe bench envs: env error: %s\n", error.c_str());
    failed = true;
    return 0;
  }
  return n / s;
}

Result<std::unique_ptr<envs::EnvClient>> client_for(const json& spec_json) {
  TROUPE_ASSIGN_OR_RETURN(auto spec, envs::parse_env_spec(spec_json, "bench envs"));
  return envs::make_env_client(spec);
}

// An episodes-per-second row, with the per-call cost (and, against in-process, the overhead per call).
Row episodes_row(const std::string& case_name, Paired figures, const std::string& baseline_name) {
  Row r =
      make_row("envs", case_name, {"episodes_per_s", "episodes/s", Better::higher}, figures, baseline_name);
  r.extra["calls_per_episode"] = kCallsPerEpisode;
  r.extra["us_per_call"] = figures.ours > 0 ? 1e6 / (figures.ours * kCallsPerEpisode) : 0.0;
  if (baseline_name == "inprocess" && figures.ours > 0 && figures.baseline > 0)
    r.extra["overhead_us_per_call"] =
        1e6 / (figures.ours * kCallsPerEpisode) - 1e6 / (figures.baseline * kCallsPerEpisode);
  return r;
}

}  // namespace

int run_envs_suite(const BenchOptions& opt) {
  using envs::json;
  const json arith = {{"name", "arithmetic"}, {"config", {{"digits", 2}}}};
  auto inproc = client_for(arith);
  if (!inproc.ok()) {
    std::fprintf(stderr, "troupe bench envs: %s\n", inproc.error().message.c_str());
    return 1;
  }
  const int reps = std::max(opt.reps, 5);
  const int n_inproc = opt.quick ? 5000 : 50000, n_ipc = opt.quick ? 500 : 3000, n_py = opt.quick ? 200 : 1000;
  bool failed = false;
  int rc = 0;
  auto inproc_eps = [&](int n) { return run_episodes(**inproc, n, failed); };

  if (opt.wants("episodes_inprocess")) {
    std::vector<double> v;
    for (int i = 0; i < reps; ++i) v.push_back(inproc_eps(n_inproc));
    double eps = median(v);
    emit(episodes_row("episodes_inprocess", {eps, eps}, "none"));  // no baseline: ratio 1 by definition
  }
  if (opt.wants("episodes_actor_ipc")) {
    json spec = arith;
    spec["isolate"] = true;
    auto ipc = client_for(spec);
    if (!ipc.ok()) {
      std::fprintf(stderr, "troupe bench envs: episodes_actor_ipc: %s\n", ipc.error().message.c_str());
      rc = 1;
    } else {
      auto p = interleaved(reps, [&] { return run_episodes(**ipc, n_ipc, failed); }, [&] { return inproc_eps(n_ipc); });
      Row r = episodes_row("episodes_actor_ipc", p, "inprocess");
      r.extra["transport"] = "ipc";
      emit(r);
    }
  }
  if (opt.wants("episodes_python_sdk")) {
    json spec = {{"name", "py_arithmetic"},
                 {"type", "remote"},
                 {"command", {python_executable(), std::string(TROUPE_SOURCE_DIR) + "/envs/python/examples/arithmetic_env.py"}},
                 {"startup_timeout_s", 60}};
    auto py = client_for(spec);
    if (!py.ok()) {
      skip_baseline("envs", "episodes_python_sdk", py.error().message);
      rc = 1;
    } else {
      auto p = interleaved(reps, [&] { return run_episodes(**py, n_py, failed); }, [&] { return inproc_eps(n_py); });
      Row r = episodes_row("episodes_python_sdk", p, "inprocess");
      r.extra["transport"] = "ipc";
      r.extra["python"] = python_executable();
      emit(r);
    }
  }
  if (opt.wants("openai_serve_concurrent64") && run_openai_serve_case(opt) != 0) rc = 1;
  if (opt.wants("nemo_gym_http") && run_nemo_gym_http_case(opt, inproc_eps) != 0) rc = 1;
  if (opt.wants("verifiers_zmq") && run_verifiers_zmq_case(opt) != 0) rc = 1;
  return failed ? 1 : rc;
}

}  // namespace troupe::bench
