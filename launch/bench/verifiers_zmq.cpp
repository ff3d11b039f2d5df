// verifiers_zmq: episodes per second through troupe's verifiers client (ZeroMQ DEALER + msgpack,
// envs/src/client_verifiers.cpp) against a real verifiers (v1) env server (the test environment
// tests/envs/verifiers/troupe_vf_echo.py, one model turn per episode), 8 episodes in flight, vs the
// same episodes through the verifiers package's own Python client (bench_vf_client.py,
// "verifiers_python_client"). Both call one stub model endpoint in this process that answers every
// chat request at once, so the figure is the env protocol and the server's own per-episode cost,
// not the model's. Needs the venv envs.verifiers installs ($TROUPE_CACHE/venv-verifiers); without
// it the case prints no row and says why.
#include "verifiers_zmq.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "troupe/base/build_config.h"
#include "troupe/envs/client.h"

extern char** environ;

namespace troupe::bench {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr int kInFlight = 8;

std::string venv_python() {
  const char* cache = std::getenv("TROUPE_CACHE");
  const char* home = std::getenv("HOME");
  fs::path base = cache && *cache ? fs::path(cache) : fs::path(home ? home : "/root") / ".cache" / "troupe";
  return (base / "venv-verifiers" / "bin" / "python").string();
}

// A child process with its stdout on a pipe (read line by line).
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
    if (out) std::fclose(out);
  }
};

bool spawn(Child& c, const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::vector<std::string> env_s(extra_env);
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env_s) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int rc = posix_spawn(&c.pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    c.pid = -1;
    return false;
  }
  c.out = fdopen(fds[0], "r");
  return true;
}

std::string read_line(FILE* f) {
  std::string s;
  for (int ch; (ch = std::fgetc(f)) != EOF && ch != '\n';) s.push_back(static_cast<char>(ch));
  return s;
}

}  // namespace

int run_verifiers_zmq_case(const BenchOptions& opt) {
  const std::string py = venv_python();
  if (!fs::exists(py)) {
    skip_baseline("envs", "verifiers_zmq", "no verifiers venv at " + py + " (ctest -R envs.verifiers installs it)");
    return 0;
  }
  const std::string dir = std::string(TROUPE_SOURCE_DIR) + "/tests/envs/verifiers";
  // the stub model endpoint: every chat request answered at once with "a"
  httplib::Server stub;
  const std::string reply =
      json{{"id", "chatcmpl-stub"},
           {"object", "chat.completion"},
           {"created", 0},
           {"model", "policy"},
           {"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", "a"}}}, {"finish_reason", "stop"}}}},
           {"usage", {{"prompt_tokens", 8}, {"completion_tokens", 1}, {"total_tokens", 9}}}}
          .dump();
  auto answer = [&reply](const httplib::Request&, httplib::Response& res) { res.set_content(reply, "application/json"); };
  stub.Post(R"(/episodes/([^/]+)/v1/chat/completions)", answer);
  stub.Post("/v1/chat/completions", answer);
  const int port = stub.bind_to_any_port("127.0.0.1");
  std::thread serving([&] { stub.listen_after_bind(); });
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  auto finish = [&](int rc) {
    stub.stop();
    serving.join();
    return rc;
  };

  Child server;
  if (!spawn(server, {py, dir + "/vf_server.py", "tcp://127.0.0.1:0"}, {"PYTHONPATH=" + dir, "TROUPE_VF_TURNS=1"}))
    return finish((skip_baseline("envs", "verifiers_zmq", "cannot start " + py), 0));
  const std::string line = read_line(server.out);
  const size_t at = line.find(" on ");
  if (at == std::string::npos)
    return finish((skip_baseline("envs", "verifiers_zmq", "the verifiers server did not start: " + line), 0));
  const std::string address = line.substr(at + 4);

  json tasks = json::array();
  for (char ch : std::string("abcdefgh")) tasks.push_back({{"prompt", std::string("Say the letter ") + ch + "."}, {"answer", std::string(1, ch)}});
  json spec_json = {{"name", "vf"}, {"type", "verifiers"}, {"address", address}, {"timeout_s", 120},
                    {"startup_timeout_s", 60}, {"config", {{"tasks", tasks}}}};
  auto spec = envs::parse_env_spec(spec_json, "bench envs");
  if (!spec.ok()) return finish((std::fprintf(stderr, "troupe bench envs: %s\n", spec.error().message.c_str()), 1));
  auto client = envs::make_env_client(*spec);
  if (!client.ok()) return finish((std::fprintf(stderr, "troupe bench envs: verifiers_zmq: %s\n", client.error().message.c_str()), 1));
  const int n = opt.quick ? 16 : 64;
  std::atomic<bool> failed{false};
  auto ours = [&] {
    std::atomic<int> next{0};
    double s = time_s([&] {
      std::vector<std::thread> ts;
      for (int t = 0; t < kInFlight; ++t)
        ts.emplace_back([&] {
          for (int i; (i = next.fetch_add(1)) < n;) {
            const std::string id = "bench-" + std::to_string(i);
            auto obs = (*client)->reset(id, static_cast<uint64_t>(i), {});
            envs::RunRequest q;
            if (obs.ok()) q.metadata = obs->metadata;
            q.base_url = base + "/v1";
            q.model = "episodes/" + id;
            q.sampling = {{"temperature", 1.0}, {"max_tokens", 4}};
            auto r = obs.ok() ? (*client)->run(id, q) : Result<envs::RunResult>(obs.error());
            if (!r.ok() && !failed.exchange(true))
              std::fprintf(stderr, "troupe bench envs: verifiers_zmq: %s\n", r.error().message.c_str());
          }
        });
      for (auto& t : ts) t.join();
    });
    return n / s;
  };
  auto baseline = [&] {
    Child c;
    if (!spawn(c, {py, dir + "/bench_vf_client.py", address, base + "/v1", std::to_string(n), std::to_string(kInFlight)},
               {"PYTHONPATH=" + dir}))
      return 0.0;
    json j = json::parse(read_line(c.out), nullptr, false);
    if (j.is_discarded() || !j.contains("episodes_per_s")) {
      if (!failed.exchange(true)) std::fprintf(stderr, "troupe bench envs: verifiers_zmq: the Python client failed\n");
      return 0.0;
    }
    return j["episodes_per_s"].get<double>();
  };
  ours();  // warm-up: the server's first episodes
  Paired p = interleaved(std::max(opt.reps, 5), ours, baseline);
  if (failed) return finish(1);
  Row r = make_row("envs", "verifiers_zmq", {"episodes_per_s", "episodes/s", Better::higher}, p,
                   "verifiers_python_client");
  r.extra["episodes"] = n;
  r.extra["in_flight"] = kInFlight;
  r.extra["calls_per_episode"] = 1;  // one `run` per episode (the model turn goes to the stub endpoint)
  r.extra["us_per_call"] = p.ours > 0 ? 1e6 / p.ours : 0.0;
  r.extra["baseline_us_per_call"] = p.baseline > 0 ? 1e6 / p.baseline : 0.0;
  emit(r);
  return finish(0);
}

}  // namespace troupe::bench
