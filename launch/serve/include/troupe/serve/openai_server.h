// The OpenAI-compatible HTTP endpoint of `troupe serve` (launch/serve/openai_server.cpp):
// /v1/chat/completions and /v1/completions (JSON or SSE streaming), /v1/models and /health over
// cpp-httplib, in front of an actors::ServeEngine that batches every request in flight. HTTP
// threads only parse, tokenize, submit to the engine and wait for (or stream) tokens.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/serve_engine.h"
#include "troupe/actors/served_turns.h"
#include "troupe/base/result.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/tokenizer.h"

namespace httplib {
class Server;
}

namespace troupe::serve {

struct OpenAiServerOptions {
  std::string model_name;   // what /v1/models lists and requests must name
  // Served adapters (troupe serve --adapter NAME=DIR): a request naming adapters[i] samples with the
  // engine model's served adapter i + 1 (Model::add_served_adapter); /v1/models lists them after the base.
  std::vector<std::string> adapters;
  int http_threads = 0;     // 0: engine slots + max_queue + 8 (slots + 16 when the queue is unbounded)
  int max_n = 16;           // most choices per request
  // Limits (`troupe serve` sets them from its flags; the defaults here are rollout.serve's).
  std::vector<std::string> api_keys;  // non-empty: every route but /health needs Authorization: Bearer KEY
  int max_tokens_cap = 0;             // max_tokens above it: 400; absent max_tokens: at most this (0: none)
  int max_prompt_tokens = 0;          // longer prompts: 400 (0: only the context bounds them)
  size_t max_body_bytes = 64u << 20;  // larger bodies: 413
  int max_queue = -1;                 // choices admitted beyond the engine's slots; past it 429 (-1: no bound)
  double request_timeout_s = 0;       // a request still running after it is cancelled: 504 (0: none)
  bool strict_fields = false;         // unknown request fields: 400 (parse_completion_request's strict)
  // rollout.serve (a generator's endpoint during a run): requests may name any model, and every
  // choice served for an episode (route /episodes/ID/v1/..., the X-Troupe-Episode header, or the
  // model name "episodes/ID") is
  // recorded here token for token. Null: nothing is recorded (troupe serve).
  actors::ServedTurnLog* record = nullptr;
  bool any_model = false;
  // A model without a chat template: /v1/chat/completions renders the built-in tags
  // (troupe/actors/chat_turns.h, as rollout.template chat does; rollout.serve) instead of a 400.
  bool builtin_chat_tags = false;
};

// "HOST:PORT" (port 0: any free one); errors start with `what` (e.g. "--bind", "rollout.serve").
Result<std::pair<std::string, int>> parse_bind(const std::string& s, const std::string& what);

class OpenAiServer {
 public:
  // chat_template may be null (then /v1/chat/completions answers 400, or renders the built-in tags
  // with options.builtin_chat_tags). eos_id < 0: no stop token.
  OpenAiServer(std::shared_ptr<actors::ServeEngine> engine, std::shared_ptr<const policy::io::Tokenizer> tokenizer,
               std::shared_ptr<const policy::io::ChatTemplate> chat_template, int32_t bos_id, int32_t eos_id,
               OpenAiServerOptions options);
  ~OpenAiServer();

  // Binds host:port (port 0: a free one) and returns the port; errors name the address.
  Result<int> bind(const std::string& host, int port);
  // Serves until stop() (from any thread).
  Status serve();
  void stop();
  bool serving() const;  // serve() is accepting connections
  // Graceful drain: from now on every request is answered 503; in_flight() counts the admitted
  // completion requests still running (streamed ones until their last byte is written).
  void begin_drain();
  int in_flight() const;
  actors::ServeEngine& engine() { return *engine_; }

  struct Impl;

 private:
  std::shared_ptr<actors::ServeEngine> engine_;
  std::unique_ptr<Impl> impl_;  // declared last: the HTTP side goes before the engine it uses
};

}  // namespace troupe::serve
