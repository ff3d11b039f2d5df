// `troupe bench envs` case nemo_gym_http: NeMo Gym's example_session_state_mgmt resource server
// (nemo-gym in $TROUPE_CACHE/venv-nemo-gym, started by the nemo_gym env from `command:`) on the
// counter rows of configs/data. An episode is reset (POST /seed_session), one step that ends it
// (POST /verify with the Responses-API output) and release, so 3 env calls and 2 HTTP requests;
// measured interleaved with the in-process arithmetic env, its baseline, like the other env rows.
#include "nemo_gym_http.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "troupe/base/build_config.h"
#include "troupe/envs/client.h"

namespace troupe::bench {

namespace {
constexpr int kCalls = 3;  // reset, step, release
}

int run_nemo_gym_http_case(const BenchOptions& opt, const std::function<double(int)>& inproc_eps) {
  const char* cache = std::getenv("TROUPE_CACHE");
  const char* home = std::getenv("HOME");
  const std::string venv_py = (cache && *cache ? std::string(cache) : std::string(home ? home : "") + "/.cache/troupe") +
                              "/venv-nemo-gym/bin/python";
  if (!std::filesystem::exists(venv_py)) {
    skip_baseline("envs", "nemo_gym_http",
                  "no nemo-gym at " + venv_py + " (install: python tests/envs/ensure_nemo_gym.py)");
    return 0;
  }
  const std::string src = TROUPE_SOURCE_DIR;
  envs::json spec = {{"name", "nemo_gym_counter"},
                     {"type", "nemo_gym"},
                     {"command", {venv_py, src + "/envs/python/nemo_gym_serve.py",
                                  "resources_servers.example_session_state_mgmt.app", "--port", "{port}"}},
                     {"startup_timeout_s", 300},
                     {"config", {{"data", src + "/configs/data/nemo_gym_counter_train.jsonl"}, {"max_turns", 2}}}};
  auto parsed = envs::parse_env_spec(spec, "bench envs");
  auto client = parsed.ok() ? envs::make_env_client(*parsed) : Result<std::unique_ptr<envs::EnvClient>>(parsed.error());
  if (!client.ok()) {
    std::fprintf(stderr, "troupe bench envs: nemo_gym_http: %s\n", client.error().message.c_str());
    return 1;
  }
  envs::EnvClient& c = **client;
  std::string error;
  auto episodes = [&](int n) {
    double s = time_s([&] {
      for (int i = 0; i < n && error.empty(); ++i) {
        auto obs = c.reset("b", static_cast<uint64_t>(i), {});
        if (!obs.ok()) {
          error = obs.error().message;
          break;
        }
        auto step = c.step("b", "The count is 5.");
        if (!step.ok() || !step->done) error = step.ok() ? "the episode did not end" : step.error().message;
        c.release("b");
      }
    });
    return error.empty() ? n / s : 0.0;
  };
  const int n = opt.quick ? 50 : 300;
  (void)episodes(10);  // warm-up (first requests of the server)
  auto p = interleaved(std::max(opt.reps, 5), [&] { return episodes(n); }, [&] { return inproc_eps(n); });
  if (!error.empty()) {
    std::fprintf(stderr, "troupe bench envs: nemo_gym_http: %s\n", error.c_str());
    return 1;
  }
  Row r = make_row("envs", "nemo_gym_http", {"episodes_per_s", "episodes/s", Better::higher}, p, "inprocess");
  r.extra["calls_per_episode"] = kCalls;
  r.extra["http_requests_per_episode"] = 2;
  r.extra["us_per_call"] = p.ours > 0 ? 1e6 / (p.ours * kCalls) : 0.0;
  if (p.ours > 0 && p.baseline > 0)
    r.extra["overhead_us_per_call"] = 1e6 / (p.ours * kCalls) - 1e6 / (p.baseline * kCalls);
  r.extra["us_per_http_request"] = p.ours > 0 ? 1e6 / (p.ours * 2) : 0.0;
  r.extra["server"] = "nemo-gym example_session_state_mgmt";
  r.extra["transport"] = "http";
  emit(r);
  return 0;
}

}  // namespace troupe::bench
