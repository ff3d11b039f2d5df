// `troupe serve MODEL_DIR|CHECKPOINT|FILE.gguf|ADAPTER_DIR [--adapter NAME=DIR ...] --bind HOST:PORT`:
// the CLI of the policy (and any LoRA adapters beside it) behind an OpenAI-compatible HTTP endpoint
// (troupe::serve's model_server.h: one serving engine batches every request in flight). Prints
// "troupe serve: listening on http://HOST:PORT" once it accepts requests; SIGINT/SIGTERM drain it
// (new requests 503, those in flight finish, then exit 0; a second signal stops it at once).
// API keys: --api-key-file or TROUPE_API_KEY.
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "troupe/launch/commands.h"
#include "troupe/base/clock.h"
#include "troupe/serve/api_keys.h"
#include "troupe/serve/model_server.h"

namespace troupe::launch {
namespace {

std::atomic<int> g_signals{0};

struct ServeOpts {
  std::string bind = "127.0.0.1:8000";
  std::string api_key_file;
  std::vector<std::string> adapters;  // NAME=DIR
  serve::ModelServerOptions model;
};

// --adapter NAME=DIR (split at the first '=').
Status parse_adapter_flags(const std::vector<std::string>& flags, serve::ModelServerOptions* mo) {
  for (const auto& f : flags) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos) return invalid_input("--adapter " + f + ": expected NAME=DIR");
    mo->adapters.emplace_back(f.substr(0, eq), f.substr(eq + 1));
  }
  return {};
}

// The keys: --api-key-file's, else TROUPE_API_KEY's one key, else none (no authentication).
Result<std::vector<std::string>> api_keys_of(const ServeOpts& o) {
  if (!o.api_key_file.empty()) return serve::read_api_key_file(o.api_key_file);
  const char* env = std::getenv("TROUPE_API_KEY");
  if (env == nullptr) return std::vector<std::string>{};
  std::string key(env);
  if (key.find_first_not_of(" \t") == std::string::npos)
    return invalid_input("TROUPE_API_KEY is set but empty (unset it to serve without authentication)");
  return std::vector<std::string>{key};
}

// Waits for a signal, then drains: new requests get 503 while those in flight finish (at most
// --request-timeout-s, after which the server cancels them anyway), then stops the server. A
// second signal stops it at once.
void drain_on_signal(serve::OpenAiServer& server, const std::atomic<bool>& served, double timeout_s) {
  while (!served.load() && g_signals.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (served.load()) return;
  server.begin_drain();
  std::fprintf(stderr, "troupe serve: draining %d request(s) in flight (a second signal stops at once)\n",
               server.in_flight());
  const double limit = timeout_s > 0 ? timeout_s + 5 : 1e18;
  const double t0 = mono_seconds();
  while (server.in_flight() > 0 && g_signals.load() < 2 && mono_seconds() - t0 < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // stop() acts only on a server that listens: a signal taken while the model was still loading
  // waits here until serve() has started (or returned by itself).
  while (!server.serving() && !served.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  server.stop();
}

int run_serve(const ServeOpts& o) {
  // SIGINT/SIGTERM set a flag (whichever thread takes them: BLAS may start threads before main), and
  // a watcher thread stops the server when it sees it.
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_signals.fetch_add(1); };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  auto where = serve::parse_bind(o.bind, "--bind");
  if (!where.ok()) return report_error(where.error());
  auto keys = api_keys_of(o);
  if (!keys.ok()) return report_error(keys.error());
  serve::ModelServerOptions mo = o.model;
  mo.api_keys = std::move(keys).value();
  if (Status st = parse_adapter_flags(o.adapters, &mo); !st.ok()) return report_error(st.error());
  auto opened = serve::open_model_server(mo);
  if (!opened.ok()) return report_error(opened.error());
  serve::OpenAiServer& server = *opened->server;
  auto port = server.bind(where->first, where->second);
  if (!port.ok()) return report_error(invalid_input("--bind: " + port.error().message));

  std::atomic<bool> served{false};
  std::thread waiter([&] { drain_on_signal(server, served, mo.request_timeout_s); });
  std::string adapters;
  for (const auto& a : mo.adapters) adapters += (adapters.empty() ? ", adapters '" : "', '") + a.first;
  if (!adapters.empty()) adapters += "'";
  const std::string base_dtype =
      opened->base_dtype == policy::BaseDtype::fp32 ? "" : ", base_dtype " + enum_string(opened->base_dtype);
  std::printf("troupe serve: %s on http://%s:%d (model '%s'%s%s, %d slots, context %d%s)\n", "listening",
              where->first.c_str(), *port, opened->model_name.c_str(), adapters.c_str(), base_dtype.c_str(),
              opened->slots, opened->context, mo.api_keys.empty() ? ", no API key" : ", API key required");
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
  app->add_option("model", o->model.path,
                  "Model directory, troupe checkpoint or .gguf file; or a LoRA checkpoint / PEFT adapter directory, "
                  "served on its base (base.json's path, or --base)")
      ->required();
  app->add_option("--base", o->model.base,
                  "The base model (directory or .gguf) of an adapter directory MODEL, instead of its base.json's path "
                  "(base.json's fingerprint, when there is one, is still checked)");
  add_base_dtype_option(app, o->model.base_dtype);
  app->add_option("--adapter", o->adapters,
                  "NAME=DIR: serve DIR's LoRA adapter (a LoRA checkpoint or PEFT adapter directory over MODEL) as model "
                  "NAME beside the base; repeat for more. Requests pick one with \"model\"; all share one batch");
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
  app->add_option("--http-threads", o->model.http_threads, "HTTP worker threads (0: max-batch + max-queue + 8)")
      ->check(CLI::Range(0, 4096));
  app->add_option("--api-key-file", o->api_key_file,
                  "File of API keys, one a line (# comments); requests need 'Authorization: Bearer KEY' "
                  "(default: TROUPE_API_KEY's key if set, else no authentication)");
  app->add_option("--max-tokens-cap", o->model.max_tokens_cap,
                  "Most new tokens a request may ask for (larger max_tokens: 400); also caps the default")
      ->check(CLI::Range(1, 1 << 24));
  app->add_option("--max-prompt-tokens", o->model.max_prompt_tokens,
                  "Most prompt tokens a request may have (longer: 400; 0: only the context bounds it)")
      ->check(CLI::Range(0, 1 << 24));
  app->add_option("--max-body-bytes", o->model.max_body_bytes, "Largest request body (larger: 413)")
      ->check(CLI::Range(static_cast<size_t>(1024), static_cast<size_t>(1) << 32));
  app->add_option("--max-queue", o->model.max_queue,
                  "Choices admitted beyond the --max-batch running ones; past it 429 with Retry-After")
      ->check(CLI::Range(0, 1 << 20));
  app->add_option("--request-timeout-s", o->model.request_timeout_s,
                  "A request still running after this is cancelled and answered 504 (0: no limit)")
      ->check(CLI::Range(0.0, 1e7));
  return {app, [o]() { return run_serve(*o); }};
}

}  // namespace troupe::launch
