// `troupe serve MODEL_DIR|CHECKPOINT|FILE.gguf --bind HOST:PORT`: the policy behind an
// OpenAI-compatible HTTP endpoint (openai_server.h), every request in flight batched by one
// serving engine (actors/serve_engine.h). Prints "troupe serve: listening on http://HOST:PORT"
// once it accepts requests; SIGINT/SIGTERM stop it (exit 0).
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "troupe/launch/commands.h"
#include "troupe/launch/openai_server.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/model_io.h"

namespace troupe::launch {
namespace {

std::atomic<bool> g_stop_requested{false};

namespace io = troupe::policy::io;

struct ServeOpts {
  std::string path, bind = "127.0.0.1:8000", name;
  int max_batch = 16, max_context = 0, prefill_tokens = 4096, threads = 0, http_threads = 0;
};

std::string default_name(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // a trailing slash
  std::string name = p.filename().string();
  if (p.extension() == ".gguf") name = p.stem().string();
  return name.empty() ? "troupe" : name;
}

int run_serve(const ServeOpts& o) {
  // SIGINT/SIGTERM set a flag (whichever thread takes them: BLAS may start threads before main), and
  // a watcher thread stops the server when it sees it.
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop_requested.store(true); };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  auto where = parse_bind(o.bind, "--bind");
  if (!where.ok()) return report_error(where.error());
  auto loaded = io::load_model(o.path);
  if (!loaded.ok()) return report_error(loaded.error());
  if (!loaded->tokenizer)
    return report_error(invalid_input(o.path + ": troupe serve needs a tokenizer (tokenizer.json or troupe_tokenizer.json)"));
  auto tmpl = io::load_chat_template_dir(o.path);
  if (!tmpl.ok()) return report_error(tmpl.error());
  actors::ServeEngineOptions eo;
  eo.slots = o.max_batch;
  const int model_ctx = loaded->model.config().max_position_embeddings;
  eo.context = o.max_context > 0 ? o.max_context : std::min(model_ctx, 2048);
  if (o.max_context > model_ctx)
    return report_error(invalid_input("--max-context " + std::to_string(o.max_context) + " exceeds the model's " +
                                      "max_position_embeddings " + std::to_string(model_ctx)));
  eo.prefill_tokens = o.prefill_tokens;
  eo.threads = o.threads;
  const int32_t bos = loaded->bos_token_id, eos = loaded->eos_token_id;
  std::shared_ptr<const io::Tokenizer> tok(std::move(loaded->tokenizer));
  auto engine = actors::ServeEngine::create(std::make_unique<policy::Model>(std::move(loaded->model)), eo);
  if (!engine.ok()) return report_error(engine.error());
  OpenAiServerOptions so;
  so.model_name = o.name.empty() ? default_name(o.path) : o.name;
  so.http_threads = o.http_threads;
  OpenAiServer server(std::move(engine).value(), tok, *tmpl, bos, eos, so);
  auto port = server.bind(where->first, where->second);
  if (!port.ok()) return report_error(invalid_input("--bind: " + port.error().message));

  std::atomic<bool> served{false};
  std::thread waiter([&] {
    while (!served.load() && !g_stop_requested.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!served.load()) server.stop();
  });
  std::printf("troupe serve: %s on http://%s:%d (model '%s', %d slots, context %d)\n", "listening",
              where->first.c_str(), *port, so.model_name.c_str(), eo.slots, eo.context);
  std::fflush(stdout);
  Status st = server.serve();
  served.store(true);  // ends the watcher if serve() returned by itself
  waiter.join();
  if (!st.ok()) return report_error(st.error());
  return 0;
}

}  // namespace

Command add_serve_command(CLI::App& root) {
  auto o = std::make_shared<ServeOpts>();
  auto* app = root.add_subcommand(
      "serve", "Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models, /health)");
  app->add_option("model", o->path, "Model directory, troupe checkpoint or .gguf file")->required();
  app->add_option("--bind", o->bind, "HOST:PORT to listen on (port 0: any free port, printed at start)");
  app->add_option("--model-name", o->name, "The model id requests name (default: the directory's or file's name)");
  app->add_option("--max-batch", o->max_batch, "Sequences sampled together at most (KV-cache slots)")
      ->check(CLI::Range(1, 4096));
  app->add_option("--max-context", o->max_context,
                  "Tokens per sequence, prompt and completion (default: max_position_embeddings, at most 2048)")
      ->check(CLI::Range(2, 1 << 20));
  app->add_option("--prefill-tokens", o->prefill_tokens, "Prompt tokens prefilled per step at most")
      ->check(CLI::Range(1, 1 << 24));
  app->add_option("--threads", o->threads, "OpenMP threads of the sampling thread (0: the default)")
      ->check(CLI::Range(0, 4096));
  app->add_option("--http-threads", o->http_threads, "HTTP worker threads (0: max-batch + 16)")
      ->check(CLI::Range(0, 4096));
  return {app, [o]() { return run_serve(*o); }};
}

}  // namespace troupe::launch
