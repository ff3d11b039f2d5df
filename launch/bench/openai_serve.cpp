// openai_serve_concurrent64: new tokens per second of 64 parallel /v1/chat/completions requests
// (each its own HTTP client thread) against an in-process OpenAiServer on 127.0.0.1, whose engine
// batches them (continuous batching), vs the same 64 requests sent one at a time ("sequential").
// The model is the tiny Qwen3 fixture (tests/hf_fixture/qwen3) with the Qwen3 chat template;
// ignore_eos makes every request sample exactly max_tokens tokens.
#include "openai_serve.h"

#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "troupe/base/build_config.h"
#include "troupe/launch/openai_server.h"
#include "troupe/policy/io/model_io.h"

namespace troupe::bench {

namespace io = troupe::policy::io;

namespace {

constexpr int kRequests = 64;

// One request; returns the completion tokens it got (0 on failure, reported once).
int chat_request(const std::string& host, int port, int i, int max_tokens, std::atomic<bool>& failed) {
  httplib::Client c(host, port);
  c.set_read_timeout(300, 0);
  nlohmann::json body = {{"model", "qwen3"},
                         {"messages", {{{"role", "user"}, {"content", "question number " + std::to_string(i)}}}},
                         {"max_tokens", max_tokens},
                         {"temperature", 1.0},
                         {"seed", i},
                         {"ignore_eos", true}};
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  if (!res || res->status != 200) {
    if (!failed.exchange(true))
      std::fprintf(stderr, "troupe bench envs: openai_serve_concurrent64: request failed: %s\n",
                   res ? res->body.c_str() : httplib::to_string(res.error()).c_str());
    return 0;
  }
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded()) return 0;
  return j["usage"]["completion_tokens"].get<int>();
}

}  // namespace

int run_openai_serve_case(const BenchOptions& opt) {
  const std::string dir = std::string(TROUPE_SOURCE_DIR) + "/tests/hf_fixture/qwen3";
  const std::string tmpl_path = std::string(TROUPE_SOURCE_DIR) + "/tests/chat_template/templates/Qwen-Qwen3-0.6B.jinja";
  auto loaded = io::load_model(dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "troupe bench envs: openai_serve_concurrent64: %s\n", loaded.error().message.c_str());
    return 1;
  }
  std::string src;
  if (FILE* f = std::fopen(tmpl_path.c_str(), "rb")) {
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) src.append(buf, n);
    std::fclose(f);
  }
  auto tmpl = io::ChatTemplate::parse(src, tmpl_path);
  if (!tmpl.ok()) {
    std::fprintf(stderr, "troupe bench envs: openai_serve_concurrent64: %s\n", tmpl.error().message.c_str());
    return 1;
  }
  actors::ServeEngineOptions eo;
  eo.slots = kRequests;
  eo.context = 256;
  const int32_t bos = loaded->bos_token_id, eos = loaded->eos_token_id;
  std::shared_ptr<const io::Tokenizer> tok(std::move(loaded->tokenizer));
  auto engine = actors::ServeEngine::create(std::make_unique<policy::Model>(std::move(loaded->model)), eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "troupe bench envs: openai_serve_concurrent64: %s\n", engine.error().message.c_str());
    return 1;
  }
  launch::OpenAiServerOptions so;
  so.model_name = "qwen3";
  so.http_threads = kRequests + 8;
  launch::OpenAiServer server(std::move(engine).value(), tok,
                              std::make_shared<const io::ChatTemplate>(std::move(tmpl).value()), bos, eos, so);
  const std::string host = "127.0.0.1";
  auto port = server.bind(host, 0);
  if (!port.ok()) {
    std::fprintf(stderr, "troupe bench envs: openai_serve_concurrent64: %s\n", port.error().message.c_str());
    return 1;
  }
  std::thread serving([&] { (void)server.serve(); });
  const int max_tokens = opt.quick ? 16 : 32;
  std::atomic<bool> failed{false};
  auto concurrent = [&] {
    std::atomic<long> tokens{0};
    double s = time_s([&] {
      std::vector<std::thread> ts;
      for (int i = 0; i < kRequests; ++i)
        ts.emplace_back([&, i] { tokens += chat_request(host, *port, i, max_tokens, failed); });
      for (auto& t : ts) t.join();
    });
    return tokens.load() / s;
  };
  auto sequential = [&] {
    long tokens = 0;
    double s = time_s([&] {
      for (int i = 0; i < kRequests; ++i) tokens += chat_request(host, *port, i, max_tokens, failed);
    });
    return tokens / s;
  };
  concurrent();  // warm-up: the arena and KV cache pages, the HTTP threads
  Paired p = interleaved(std::max(opt.reps, 5), concurrent, sequential);
  const int peak = server.engine().peak_batch();
  server.stop();
  serving.join();
  if (failed) return 1;
  const double new_tokens = static_cast<double>(kRequests) * max_tokens;
  Row r = make_row("envs", "openai_serve_concurrent64", {"new_tokens_per_s", "tokens/s", Better::higher}, p,
                   "sequential",
                   {{"requests", kRequests},
                    {"max_tokens", max_tokens},
                    {"model", "tests/hf_fixture/qwen3"},
                    {"peak_batch", peak},
                    {"requests_per_s", p.ours * kRequests / new_tokens},
                    {"us_per_call", p.ours > 0 ? 1e6 * new_tokens / (p.ours * kRequests) : 0.0},
                    {"baseline_us_per_call", p.baseline > 0 ? 1e6 * new_tokens / (p.baseline * kRequests) : 0.0}});
  emit(r);
  return 0;
}

}  // namespace troupe::bench
