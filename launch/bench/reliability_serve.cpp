// serve_overload: `troupe serve`'s server (open_model_server, in process, on the tiny Qwen3 fixture)
// with --max-batch 2 --max-queue 2 and an API key, hit by 32 completion requests at once (64 tokens
// each, ignore_eos) that honour 429's Retry-After and try again, and by 8 requests with a wrong key.
// Invariant it checks: every request gets an answer it should (200, or 429 with Retry-After until
// admitted; 401 for a wrong key), none is dropped or fails, and the server serves on afterwards.
// The row's figure is the requests served in full against the requests sent (ratio 1 = none lost).
#include "reliability_serve.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "troupe/base/build_config.h"
#include "troupe/serve/model_server.h"

namespace troupe::bench {
namespace {

constexpr int kRequests = 32, kWrongKey = 8, kMaxTokens = 64, kMaxAttempts = 100;
constexpr const char* kKey = "sk-bench-reliability";

struct Counts {
  std::atomic<int> served{0}, first_try_429{0}, retries{0}, retry_after{0}, unauthorized{0}, other{0};
};

// One request, sent again after Retry-After while it is answered 429. Counts what it got.
void send_request(const std::string& host, int port, int i, const std::string& key, Counts& n) {
  httplib::Client c(host, port);
  c.set_read_timeout(120, 0);
  c.set_bearer_token_auth(key);
  const nlohmann::json body = {{"model", "bench"},
                               {"prompt", "request " + std::to_string(i)},
                               {"max_tokens", kMaxTokens},
                               {"temperature", 1.0},
                               {"seed", i},
                               {"ignore_eos", true}};
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    if (!res) {
      if (n.other++ == 0)
        std::fprintf(stderr, "troupe bench reliability: serve_overload: %s\n",
                     httplib::to_string(res.error()).c_str());
      return;
    }
    if (res->status == 200) {
      ++n.served;
      return;
    }
    if (res->status == 401) {
      ++n.unauthorized;
      return;
    }
    if (res->status != 429) {
      if (n.other++ == 0)
        std::fprintf(stderr, "troupe bench reliability: serve_overload: %d %s\n", res->status,
                     res->body.c_str());
      return;
    }
    if (attempt == 0)
      ++n.first_try_429;
    else
      ++n.retries;
    int wait_s = 1;
    if (res->has_header("Retry-After")) {
      ++n.retry_after;
      wait_s = std::max(0, std::atoi(res->get_header_value("Retry-After").c_str()));
    }
    std::this_thread::sleep_for(std::chrono::seconds(wait_s));
  }
  ++n.other;  // still refused after kMaxAttempts
}

}  // namespace

int run_serve_overload_case(const BenchOptions&) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "troupe bench reliability: serve_overload: %s\n", what.c_str());
    return 1;
  };
  const auto t0 = std::chrono::steady_clock::now();
  serve::ModelServerOptions o;
  o.path = std::string(TROUPE_SOURCE_DIR) + "/tests/hf_fixture/qwen3";
  o.name = "bench";
  o.max_batch = 2;
  o.max_queue = 2;
  o.max_context = 256;
  o.api_keys = {kKey};
  auto ms = serve::open_model_server(o);
  if (!ms.ok()) return fail(ms.error().message);
  serve::OpenAiServer& server = *ms->server;
  const std::string host = "127.0.0.1";
  auto port = server.bind(host, 0);
  if (!port.ok()) return fail(port.error().message);
  std::thread serving([&] { (void)server.serve(); });
  Counts n;
  std::vector<std::thread> ts;
  for (int i = 0; i < kRequests; ++i) ts.emplace_back([&, i] { send_request(host, *port, i, kKey, n); });
  for (int i = 0; i < kWrongKey; ++i)
    ts.emplace_back([&, i] { send_request(host, *port, 1000 + i, "sk-wrong", n); });
  for (auto& t : ts) t.join();
  Counts after;  // the server serves on
  send_request(host, *port, 0, kKey, after);
  const int peak = server.engine().peak_batch();
  server.stop();
  serving.join();
  const bool survived = after.served == 1;
  const bool ok = survived && n.served == kRequests && n.unauthorized == kWrongKey && n.other == 0 &&
                  n.retry_after == n.first_try_429 + n.retries;
  emit(make_row("reliability", "serve_overload", {"requests_served", "requests", Better::higher},
                {static_cast<double>(n.served), static_cast<double>(kRequests)}, "requests_sent",
                {{"survived", survived ? 1 : 0},
                 {"max_batch", o.max_batch},
                 {"max_queue", o.max_queue},
                 {"first_try_429", n.first_try_429.load()},
                 {"retried_429", n.retries.load()},
                 {"with_retry_after", n.retry_after.load()},
                 {"wrong_key_requests", kWrongKey},
                 {"unauthorized_401", n.unauthorized.load()},
                 {"other_errors", n.other.load()},
                 {"peak_batch", peak},
                 {"case_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}}));
  return ok ? 0 : 1;
}

}  // namespace troupe::bench
