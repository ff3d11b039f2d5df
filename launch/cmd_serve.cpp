// `troupe serve MODEL_DIR|CHECKPOINT|FILE.gguf --bind HOST:PORT`: the CLI of the policy behind an
// OpenAI-compatible HTTP endpoint (troupe::serve's model_server.h: one serving engine batches
// every request in flight). Prints "troupe serve: listening on http://HOST:PORT"
// once it accepts requests; SIGINT/SIGTERM stop it (exit 0).
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "troupe/launch/commands.h"
#include "troupe/serve/model_server.h"

namespace troupe::launch {
namespace {

std::atomic<bool> g_stop_requested{false};

struct ServeOpts {
  std::string bind = "127.0.0.1:8000";
  serve::ModelServerOptions model;
};

int run_serve(const ServeOpts& o) {
  // SIGINT/SIGTERM set a flag (whichever thread takes them: BLAS may start threads before main), and
  // a watcher thread stops the server when it sees it.
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop_requested.store(true); };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  auto where = serve::parse_bind(o.bind, "--bind");
  if (!where.ok()) return report_error(where.error());
  auto opened = serve::open_model_server(o.model);
  if (!opened.ok()) return report_error(opened.error());
  serve::OpenAiServer& server = *opened->server;
  auto port = server.bind(where->first, where->second);
  if (!port.ok()) return report_error(invalid_input("--bind: " + port.error().message));

  std::atomic<bool> served{false};
  std::thread waiter([&] {
    while (!served.load() && !g_stop_requested.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!served.load()) server.stop();
  });
  std::printf("troupe serve: %s on http://%s:%d (model '%s', %d slots, context %d)\n", "listening",
              where->first.c_str(), *port, opened->model_name.c_str(), opened->slots, opened->context);
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
  app->add_option("model", o->model.path, "Model directory, troupe checkpoint or .gguf file")->required();
  app->add_option("--bind", o->bind, "HOST:PORT to listen on (port 0: any free port, printed at start)");
  app->add_option("--model-name", o->model.name, "The model id requests name (default: the directory's or file's name)");
  app->add_option("--max-batch", o->model.max_batch, "Sequences sampled together at most (KV-cache slots)")
      ->check(CLI::Range(1, 4096));
  app->add_option("--max-context", o->model.max_context,
                  "Tokens per sequence, prompt and completion (default: max_position_embeddings, at most 2048)")
      ->check(CLI::Range(2, 1 << 20));
  app->add_option("--prefill-tokens", o->model.prefill_tokens, "Prompt tokens prefilled per step at most")
      ->check(CLI::Range(1, 1 << 24));
  app->add_option("--threads", o->model.threads, "OpenMP threads of the sampling thread (0: the default)")
      ->check(CLI::Range(0, 4096));
  app->add_option("--http-threads", o->model.http_threads, "HTTP worker threads (0: max-batch + 16)")
      ->check(CLI::Range(0, 4096));
  return {app, [o]() { return run_serve(*o); }};
}

}  // namespace troupe::launch
