// The OpenAI-compatible HTTP endpoint (openai_server.h): routes, prompt rendering and tokenizing,
// reading each choice's tokens from the serving engine, stop strings, tool calls, SSE streaming.
#include "troupe/serve/openai_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <thread>

#include "troupe/actors/chat_turns.h"
#include "troupe/base/clock.h"
#include "troupe/serve/api_keys.h"
#include "troupe/serve/json_constraint.h"
#include "troupe/serve/openai_protocol.h"

namespace troupe::serve {

namespace io = troupe::policy::io;

namespace {

constexpr const char* kToolCallOpen = "<tool_call>";

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// The longest prefix of text that ends on a whole UTF-8 character (and not on U+FFFD, which a
// decoder writes for bytes whose character is still incomplete).
size_t utf8_complete_prefix(const std::string& text) {
  size_t n = text.size();
  if (n >= 3 && text.compare(n - 3, 3, "\xEF\xBF\xBD") == 0) return n - 3;
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One choice as read from the engine.
struct Choice {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top;
  std::string text;
  std::string finish = "stop";
  bool error = false;
  std::string error_message;
  size_t content_tokens = 0;  // tokens whose text is the content (a final stop token excluded)
  size_t streamed = 0;        // bytes of text already sent as deltas (streaming)
};

// A request's deadline: past it the watchdog cancels its streams and marks it expired.
struct Deadline {
  int64_t at_ns = 0;
  std::vector<std::shared_ptr<actors::ServeStream>> streams;
  std::atomic<bool> expired{false};
};

// Cancels the streams of requests past their deadline (--request-timeout-s), checking every 50 ms.
class Watchdog {
 public:
  Watchdog() = default;
  ~Watchdog() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void watch(const std::shared_ptr<Deadline>& d) {
    std::lock_guard lk(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    watched_.push_back(d);
  }

 private:
  void loop() {
    std::unique_lock lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(50));
      const int64_t now = mono_nanoseconds();
      for (auto it = watched_.begin(); it != watched_.end();) {
        auto d = it->lock();
        if (d && now < d->at_ns) {
          ++it;
          continue;
        }
        if (d) {
          d->expired.store(true);
          for (auto& s : d->streams) s->cancel();
        }
        it = watched_.erase(it);
      }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::list<std::weak_ptr<Deadline>> watched_;
  std::thread thread_;
};

}  // namespace

struct OpenAiServer::Impl {
  httplib::Server http;
  actors::ServeEngine* engine = nullptr;
  std::shared_ptr<const io::Tokenizer> tok;
  std::shared_ptr<const io::ChatTemplate> tmpl;
  int32_t bos = -1, eos = -1;
  std::vector<int32_t> chat_stops;  // eos and the end-of-turn tokens the tokenizer has
  OpenAiServerOptions opt;
  std::atomic<uint64_t> next_id{1};
  std::atomic<int> admitted{0};       // choices of the completion requests running or queued
  std::atomic<int> admitted_requests{0};
  std::atomic<bool> draining{false};
  Watchdog watchdog;
  std::once_flag texts_once;
  std::shared_ptr<const TokenTexts> texts;  // response_format: every token's text, computed on first use

  const std::shared_ptr<const TokenTexts>& token_texts() {
    std::call_once(texts_once, [this] { texts = TokenTexts::of(*tok, engine->vocab_size()); });
    return texts;
  }

  // Holds a request's place in the bound (released when the last copy goes: streamed requests
  // keep one in their content provider until the last chunk is written).
  struct Admission {
    Impl* m;
    int n;
    ~Admission() {
      m->admitted.fetch_sub(n);
      m->admitted_requests.fetch_sub(1);
    }
  };

  // A place for n choices, or the 429 / 503 that refuses it.
  std::optional<ApiError> admit(int n, std::shared_ptr<Admission>* out) {
    const int cur = admitted.fetch_add(n);
    admitted_requests.fetch_add(1);
    std::shared_ptr<Admission> held(new Admission{this, n});
    if (draining.load()) return ApiError{503, "the server is shutting down", "", "server_error", "server_shutting_down"};
    if (opt.max_queue >= 0 && cur + n > engine->slots() + opt.max_queue)
      return ApiError{429, "the server is busy: " + std::to_string(cur) + " choices are running or queued (--max-batch " +
                               std::to_string(engine->slots()) + " + --max-queue " + std::to_string(opt.max_queue) +
                               "); retry later",
                      "", "server_error", "rate_limit_exceeded"};
    *out = std::move(held);
    return std::nullopt;
  }

  struct Prepared {
    CompletionRequest req;
    std::vector<int32_t> prompt;
    int max_tokens = 16;
    std::string id;
    std::string episode;  // rollout.serve: the episode it is served for ("" = none, not recorded)
    std::string model;    // the model id replies name: the base's, or the served adapter's
    int adapter = 0;      // the served adapter (OpenAiServerOptions::adapters: index + 1); 0 = the base
    std::shared_ptr<Admission> admission;
    std::shared_ptr<Deadline> deadline;  // null without --request-timeout-s
    bool expired() const { return deadline && deadline->expired.load(); }
  };

  // rollout.serve: a finished choice of an episode's request, as sampled.
  void record(const Prepared& p, const Choice& c, const actors::ServeStream& s) {
    if (!opt.record || p.episode.empty() || c.error) return;
    actors::ServedTurn t;
    t.prompt_tokens = p.prompt;
    t.tokens = c.tokens;
    t.logprobs = c.logprobs;
    t.policy_version = s.policy_version();
    t.finish = c.finish;
    t.text = c.text;
    opt.record->record(p.episode, std::move(t));
  }

  std::string token_text(int32_t id) const {
    auto t = tok->decode({id}, false);
    return t.ok() ? *t : std::string();
  }
  ojson token_entry(int32_t id, float lp) const {
    const std::string s = token_text(id);
    ojson bytes = ojson::array();
    for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
    return ojson{{"token", s}, {"logprob", lp}, {"bytes", bytes}};
  }

  std::optional<ApiError> prepare(const std::string& body, bool chat, Prepared* p) {
    if (auto e = parse_completion_request(body, chat, opt.max_n, &p->req, opt.strict_fields)) return e;
    const CompletionRequest& r = p->req;
    p->model = opt.model_name;
    if (r.model != opt.model_name && !opt.any_model) {
      auto it = std::find(opt.adapters.begin(), opt.adapters.end(), r.model);
      if (it == opt.adapters.end())
        return ApiError{404, "The model '" + r.model + "' does not exist; this server serves " + known_models(), "model",
                        "invalid_request_error", "model_not_found"};
      p->model = r.model;
      p->adapter = static_cast<int>(it - opt.adapters.begin()) + 1;
    }
    const char* prompt_field = chat ? "messages" : "prompt";
    if (chat && !tmpl && opt.builtin_chat_tags) {  // rollout.serve: the built-in tags, as rollout.template chat
      auto f = actors::make_chat_format(*tok, nullptr);
      auto ids = f.ok() ? actors::encode_chat_prompt(*f, *tok, r.messages) : Result<std::vector<int32_t>>(f.error());
      if (!ids.ok()) return ApiError{400, "the built-in chat tags refused the messages: " + ids.error().message, "messages"};
      p->prompt = std::move(ids).value();
    } else if (chat) {
      if (!tmpl)
        return ApiError{400, "the model has no chat template; use /v1/completions", "messages"};
      io::ChatRenderOptions o = io::chat_options_for(tok.get(), bos, eos);
      o.add_generation_prompt = true;
      o.tools = r.tools;
      o.extra = r.template_kwargs;
      auto text = io::render_chat(*tmpl, r.messages, o);
      if (!text.ok()) return ApiError{400, "the chat template refused the messages: " + text.error().message, "messages"};
      auto ids = tok->encode(*text);
      if (!ids.ok()) return ApiError{400, ids.error().message, "messages"};
      p->prompt = std::move(ids).value();
    } else if (r.prompt_is_tokens) {
      p->prompt = r.prompt_tokens;
      for (size_t i = 0; i < p->prompt.size(); ++i)
        if (p->prompt[i] >= engine->vocab_size())
          return ApiError{400, "prompt[" + std::to_string(i) + "] = " + std::to_string(p->prompt[i]) +
                                   " is outside the vocabulary of " + std::to_string(engine->vocab_size()),
                          "prompt"};
    } else {
      auto ids = tok->encode(r.prompt_text);
      if (!ids.ok()) return ApiError{400, ids.error().message, "prompt"};
      p->prompt = std::move(ids).value();
    }
    if (p->prompt.empty()) {  // as `troupe generate`: an empty prompt starts from BOS
      if (bos < 0) return ApiError{400, "the prompt is empty and the model has no BOS token", prompt_field};
      p->prompt.push_back(bos);
    }
    const int ctx = engine->context();
    const int n = static_cast<int>(p->prompt.size());
    if (opt.max_prompt_tokens > 0 && n > opt.max_prompt_tokens)
      return ApiError{400, "the prompt has " + std::to_string(n) + " tokens; this server takes at most " +
                               std::to_string(opt.max_prompt_tokens) + " (--max-prompt-tokens)",
                      prompt_field};
    if (opt.max_tokens_cap > 0 && r.max_tokens && *r.max_tokens > opt.max_tokens_cap)
      return ApiError{400, r.max_tokens_field + " " + std::to_string(*r.max_tokens) + " exceeds this server's cap of " +
                               std::to_string(opt.max_tokens_cap) + " (--max-tokens-cap)",
                      r.max_tokens_field};
    if (n >= ctx)
      return ApiError{400, "the prompt has " + std::to_string(n) + " tokens; this server's context is " +
                               std::to_string(ctx) + " tokens (prompt and completion)",
                      prompt_field};
    p->max_tokens = r.max_tokens ? *r.max_tokens : (chat ? ctx - n : std::min(16, ctx - n));
    if (!r.max_tokens && opt.max_tokens_cap > 0) p->max_tokens = std::min(p->max_tokens, opt.max_tokens_cap);
    if (n + p->max_tokens > ctx)
      return ApiError{400, "max_tokens " + std::to_string(p->max_tokens) + " + the prompt's " + std::to_string(n) +
                               " tokens exceed this server's context of " + std::to_string(ctx) + " tokens",
                      r.max_tokens_field};
    p->id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id.fetch_add(1));
    return std::nullopt;
  }

  std::vector<std::shared_ptr<actors::ServeStream>> submit(const Prepared& p) {
    const CompletionRequest& r = p.req;
    // Without a seed every request samples its own stream (the id counter); with one, choice i is
    // stream i of that seed, as Model::generate samples prompt i.
    const uint64_t seed = r.seed ? *r.seed : 0x9E3779B97F4A7C15ull * next_id.fetch_add(1);
    std::vector<std::shared_ptr<actors::ServeStream>> streams;
    for (int i = 0; i < r.n; ++i) {
      actors::ServeRequest q;
      q.prompt = p.prompt;
      q.sampling.temperature = r.temperature;
      q.sampling.top_k = r.top_k;
      q.sampling.top_p = r.top_p;
      q.sampling.seed = seed;
      q.sampling.stream = i;
      q.sampling.top_logprobs = r.top_logprobs;
      q.sampling.adapter = p.adapter;
      q.max_tokens = p.max_tokens;
      if (r.json_object) q.sampling.constraint = json_object_constraint(token_texts(), chat_stops);
      if (r.json_schema) q.sampling.constraint = json_schema_constraint(token_texts(), r.json_schema, chat_stops);
      if (!r.ignore_eos) {
        if (r.chat) q.stop_tokens = chat_stops;
        else if (eos >= 0) q.stop_tokens = {eos};
      }
      streams.push_back(engine->submit(std::move(q)));
    }
    return streams;
  }

  // Reads one choice to its end; on_delta (streaming) gets each piece of text that is final, with
  // the index of the token that completed it.
  Choice consume(actors::ServeStream& s, const CompletionRequest& r,
                 const std::function<bool(const std::string&, size_t)>& on_delta) {
    Choice c;
    size_t emitted = 0;
    bool stop_string = false;
    const bool hold_tools = r.chat && !r.tools.is_null();
    policy::SlotToken t;
    std::string text;
    if (r.stop.empty() && !on_delta) s.wake_per_token(false);  // nothing to do before the end
    while (s.next(&t)) {
      c.tokens.push_back(t.token);
      c.logprobs.push_back(t.logprob);
      c.top.push_back(std::move(t.top));
      if (r.stop.empty() && !on_delta) continue;
      auto d = tok->decode(c.tokens, true);
      text = d.ok() ? *d : std::string();
      size_t cut = std::string::npos;
      for (const auto& ss : r.stop) cut = std::min(cut, text.find(ss));
      if (cut != std::string::npos) {
        text.resize(cut);
        stop_string = true;
        s.cancel();
      }
      if (on_delta) {
        size_t safe = stop_string ? text.size() : utf8_complete_prefix(text);
        if (!stop_string)
          for (const auto& ss : r.stop) safe = std::min(safe, partial_marker_start(text.substr(0, safe), ss));
        if (hold_tools) {
          const size_t k = text.find(kToolCallOpen);
          safe = std::min(safe, k != std::string::npos ? k : partial_marker_start(text.substr(0, safe), kToolCallOpen));
        }
        std::string piece = safe > emitted ? text.substr(emitted, safe - emitted) : std::string();
        if (safe > emitted) emitted = safe;
        if (!on_delta(piece, c.tokens.size() - 1)) {
          s.cancel();
          c.error = true;
          c.error_message = "the client went away";
          return c;
        }
      }
      if (stop_string) break;
    }
    c.content_tokens = c.tokens.size();
    if (stop_string) {
      c.text = text;
      c.finish = "stop";
      c.streamed = emitted;
      return c;
    }
    auto d = tok->decode(c.tokens, true);
    c.text = d.ok() ? *d : std::string();
    switch (s.finish()) {
      case actors::ServeFinish::stop:
        c.finish = "stop";
        if (c.content_tokens > 0) --c.content_tokens;  // the stop token has no text
        break;
      case actors::ServeFinish::length: c.finish = "length"; break;
      case actors::ServeFinish::error:
        c.error = true;
        c.error_message = s.error();
        break;
      default: c.finish = "stop"; break;
    }
    if (on_delta && emitted < c.text.size() && !hold_tools) {
      on_delta(c.text.substr(emitted), c.tokens.size() ? c.tokens.size() - 1 : 0);
      emitted = c.text.size();
    }
    c.streamed = emitted;
    return c;
  }

  ojson troupe_field(const Prepared& p, const Choice& c, const actors::ServeStream& s) const {
    ojson f{{"prompt_token_ids", p.prompt}, {"completion_token_ids", c.tokens}, {"completion_logprobs", c.logprobs}};
    if (opt.record) {
      f["policy_version"] = s.policy_version();
      f["episode_id"] = p.episode.empty() ? ojson(nullptr) : ojson(p.episode);
    }
    return f;
  }

  ojson chat_logprobs(const Choice& c, size_t from, size_t to) const {
    ojson content = ojson::array();
    for (size_t i = from; i < to && i < c.tokens.size(); ++i) {
      ojson e = token_entry(c.tokens[i], c.logprobs[i]);
      ojson top = ojson::array();
      for (const auto& [id, lp] : c.top[i]) top.push_back(token_entry(id, lp));
      e["top_logprobs"] = top;
      content.push_back(std::move(e));
    }
    return ojson{{"content", content}};
  }

  ojson completion_logprobs(const Choice& c) const {
    ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(), offs = ojson::array();
    size_t off = 0;
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const std::string s = token_text(c.tokens[i]);
      tokens.push_back(s);
      lps.push_back(c.logprobs[i]);
      ojson top = ojson::object();
      for (const auto& [id, lp] : c.top[i]) top[token_text(id)] = lp;
      tops.push_back(top);
      offs.push_back(off);
      off += s.size();
    }
    return ojson{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
  }

  ojson usage(const Prepared& p, const std::vector<Choice>& cs) const {
    size_t n = 0;
    for (const auto& c : cs) n += c.tokens.size();
    return ojson{{"prompt_tokens", p.prompt.size()}, {"completion_tokens", n},
                 {"total_tokens", p.prompt.size() + n}};
  }

  void reply_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(error_body(e)), "application/json");
  }

  ApiError timeout_error() const {
    return ApiError{504, "the request ran longer than this server's --request-timeout-s " +
                             std::to_string(static_cast<long long>(opt.request_timeout_s)) + " s and was cancelled",
                    "", "server_error", "timeout"};
  }

  // Submits the request's choices, under its deadline when there is a timeout.
  std::vector<std::shared_ptr<actors::ServeStream>> start(Prepared& p) {
    auto streams = submit(p);
    if (opt.request_timeout_s > 0) {
      p.deadline = std::make_shared<Deadline>();
      p.deadline->at_ns = mono_nanoseconds() + static_cast<int64_t>(opt.request_timeout_s * 1e9);
      p.deadline->streams = streams;
      watchdog.watch(p.deadline);
    }
    return streams;
  }

  void complete(Prepared& p, httplib::Response& res) {
    const CompletionRequest& r = p.req;
    auto streams = start(p);
    std::vector<Choice> cs;
    for (auto& s : streams) cs.push_back(consume(*s, r, nullptr));
    if (p.expired()) return reply_error(res, timeout_error());
    for (const auto& c : cs)
      if (c.error) return reply_error(res, ApiError{500, "sampling failed: " + c.error_message, "", "server_error"});
    ojson choices = ojson::array();
    for (size_t i = 0; i < cs.size(); ++i) {
      Choice& c = cs[i];
      ojson ch = {{"index", i}};
      if (r.chat) {
        ojson msg = {{"role", "assistant"}, {"content", c.text}};
        if (!r.tools.is_null()) {
          ToolCallParse tc = parse_tool_calls(c.text, "call_" + p.id.substr(9) + "_" + std::to_string(i) + "_");
          if (!tc.calls.empty()) {
            msg["content"] = tc.content.empty() ? ojson(nullptr) : ojson(tc.content);
            msg["tool_calls"] = tc.calls;
            c.finish = "tool_calls";
          }
        }
        ch["message"] = msg;
        ch["logprobs"] = r.logprobs ? chat_logprobs(c, 0, c.tokens.size()) : ojson(nullptr);
      } else {
        ch["text"] = c.text;
        ch["logprobs"] = r.logprobs ? completion_logprobs(c) : ojson(nullptr);
      }
      ch["finish_reason"] = c.finish;
      ch["troupe"] = troupe_field(p, c, *streams[i]);
      record(p, c, *streams[i]);
      choices.push_back(std::move(ch));
    }
    ojson out = {{"id", p.id},
                 {"object", r.chat ? "chat.completion" : "text_completion"},
                 {"created", unix_now()},
                 {"model", p.model},
                 {"choices", choices},
                 {"usage", usage(p, cs)}};
    res.set_content(dump(out), "application/json");
  }

  void stream(std::shared_ptr<Prepared> p, httplib::Response& res) {
    auto streams = std::make_shared<std::vector<std::shared_ptr<actors::ServeStream>>>(start(*p));
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [this, p, streams](size_t, httplib::DataSink& sink) {
      const CompletionRequest& r = p->req;
      const int64_t created = unix_now();
      auto send = [&](const ojson& j) {
        const std::string line = "data: " + dump(j) + "\n\n";
        return sink.write(line.data(), line.size());
      };
      auto chunk = [&](ojson choice) {
        return ojson{{"id", p->id},
                     {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
                     {"created", created},
                     {"model", p->model},
                     {"choices", ojson::array({std::move(choice)})}};
      };
      std::vector<Choice> cs;
      bool alive = true;
      for (size_t i = 0; i < streams->size(); ++i) {
        if (!alive) {
          (*streams)[i]->cancel();
          continue;
        }
        if (r.chat)
          alive = send(chunk({{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                              {"logprobs", nullptr}, {"finish_reason", nullptr}}));
        Choice c = consume(*(*streams)[i], r, [&](const std::string& piece, size_t) {
          if (!alive) return false;
          if (piece.empty()) return true;
          ojson ch = {{"index", i}};
          if (r.chat) ch["delta"] = {{"content", piece}};
          else ch["text"] = piece;
          ch["logprobs"] = nullptr;
          ch["finish_reason"] = nullptr;
          alive = send(chunk(std::move(ch)));
          return alive;
        });
        if (alive && p->expired()) {
          send(error_body(timeout_error()));
          alive = false;
        }
        if (!alive || c.error) {
          if (c.error && alive)
            send(error_body(ApiError{500, "sampling failed: " + c.error_message, "", "server_error"}));
          alive = false;
          continue;
        }
        ojson last = {{"index", i}};
        if (r.chat) {
          ojson delta = ojson::object();
          if (!r.tools.is_null()) {  // the text held back from the first <tool_call> on
            ToolCallParse tc = parse_tool_calls(c.text, "call_" + p->id.substr(9) + "_" + std::to_string(i) + "_");
            if (tc.calls.empty()) {
              if (c.streamed < c.text.size()) delta["content"] = c.text.substr(c.streamed);
            } else {
              for (size_t j = 0; j < tc.calls.size(); ++j) tc.calls[j]["index"] = j;
              delta["tool_calls"] = tc.calls;
              c.finish = "tool_calls";
            }
          }
          last["delta"] = delta;
          last["logprobs"] = r.logprobs ? chat_logprobs(c, 0, c.tokens.size()) : ojson(nullptr);
        } else {
          last["text"] = "";
          last["logprobs"] = r.logprobs ? completion_logprobs(c) : ojson(nullptr);
        }
        last["finish_reason"] = c.finish;
        last["troupe"] = troupe_field(*p, c, *(*streams)[i]);
        record(*p, c, *(*streams)[i]);
        alive = send(chunk(std::move(last)));
        cs.push_back(std::move(c));
      }
      if (alive && r.include_usage) {
        ojson u = {{"id", p->id},
                   {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
                   {"created", created},
                   {"model", p->model},
                   {"choices", ojson::array()},
                   {"usage", usage(*p, cs)}};
        alive = send(u);
      }
      if (alive) {
        static const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
      }
      sink.done();
      return true;
    });
  }

  void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat, std::string episode = {}) {
    auto p = std::make_shared<Prepared>();
    if (auto e = prepare(req.body, chat, p.get())) return reply_error(res, *e);
    if (episode.empty() && req.has_header("X-Troupe-Episode")) episode = req.get_header_value("X-Troupe-Episode");
    static const std::string kEpisodeModel = "episodes/";  // rollout.serve: model "episodes/ID"
    if (episode.empty() && opt.record && p->req.model.rfind(kEpisodeModel, 0) == 0)
      episode = p->req.model.substr(kEpisodeModel.size());
    p->episode = std::move(episode);
    if (auto e = admit(p->req.n, &p->admission)) {
      if (e->status == 429) res.set_header("Retry-After", "1");
      return reply_error(res, *e);
    }
    if (p->req.stream) return stream(p, res);
    complete(*p, res);
  }

  // The base first, then each served adapter (with "parent": the base, as vLLM lists LoRA modules).
  void models(const httplib::Request&, httplib::Response& s) {
    const int64_t now = unix_now();
    ojson data = ojson::array();
    data.push_back({{"id", opt.model_name}, {"object", "model"}, {"created", now},
                    {"owned_by", "troupe"}, {"max_model_len", engine->context()}});
    for (const auto& a : opt.adapters)
      data.push_back({{"id", a}, {"object", "model"}, {"created", now}, {"owned_by", "troupe"},
                      {"max_model_len", engine->context()}, {"parent", opt.model_name}});
    s.set_content(dump(ojson{{"object", "list"}, {"data", data}}), "application/json");
  }

  // 'base', 'a', 'b' (the 404's list).
  std::string known_models() const {
    std::string out = "'" + opt.model_name + "'";
    for (const auto& a : opt.adapters) out += ", '" + a + "'";
    return out;
  }

  void routes() {
    auto guarded = [this](auto fn) {
      return [this, fn](const httplib::Request& req, httplib::Response& res) {
        try {
          fn(req, res);
        } catch (const std::exception& e) {
          reply_error(res, ApiError{500, std::string("internal error: ") + e.what(), "", "server_error"});
        }
      };
    };
    http.Post("/v1/chat/completions", guarded([this](const httplib::Request& q, httplib::Response& s) {
      handle_completion(q, s, true);
    }));
    http.Post("/v1/completions", guarded([this](const httplib::Request& q, httplib::Response& s) {
      handle_completion(q, s, false);
    }));
    if (opt.record) {  // rollout.serve: the same routes under an episode's base URL
      http.Post(R"(/episodes/([^/]+)/v1/chat/completions)", guarded([this](const httplib::Request& q, httplib::Response& s) {
        handle_completion(q, s, true, q.matches[1].str());
      }));
      http.Post(R"(/episodes/([^/]+)/v1/completions)", guarded([this](const httplib::Request& q, httplib::Response& s) {
        handle_completion(q, s, false, q.matches[1].str());
      }));
      http.Get(R"(/episodes/([^/]+)/v1/models)", guarded([this](const httplib::Request& q, httplib::Response& s) {
        models(q, s);
      }));
    }
    http.Get("/v1/models", guarded([this](const httplib::Request& q, httplib::Response& s) { models(q, s); }));
    http.Get("/health", [this](const httplib::Request&, httplib::Response& s) {
      ojson h = {{"status", "ok"}, {"model", opt.model_name}, {"engine_steps", engine->steps()},
                 {"peak_batch", engine->peak_batch()}};
      if (opt.record) h["policy_version"] = engine->version();
      s.set_content(dump(h), "application/json");
    });
    // Answered before the body is read: the connection closes after the reply, so that the unread
    // body is never taken for the next request of a kept-alive connection.
    http.set_pre_routing_handler([this](const httplib::Request& q, httplib::Response& s) {
      if (draining.load()) {
        s.set_header("Connection", "close");
        reply_error(s, ApiError{503, "the server is shutting down", "", "server_error", "server_shutting_down"});
        return httplib::Server::HandlerResponse::Handled;
      }
      if (opt.api_keys.empty() || q.path == "/health" ||
          bearer_matches(q.get_header_value("Authorization"), opt.api_keys))
        return httplib::Server::HandlerResponse::Unhandled;
      s.set_header("Connection", "close");
      s.set_header("WWW-Authenticate", "Bearer");
      reply_error(s, ApiError{401, "a valid API key is required: send the header 'Authorization: Bearer KEY' with a "
                                   "key of this server (troupe serve --api-key-file or TROUPE_API_KEY)",
                              "", "invalid_request_error", "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    });
    http.set_error_handler([this](const httplib::Request& q, httplib::Response& s) {
      if (!s.body.empty()) return;
      const int status = s.status;
      if (status == 413)
        reply_error(s, ApiError{413, "the request body exceeds this server's limit of " +
                                         std::to_string(opt.max_body_bytes) + " bytes (--max-body-bytes)",
                                ""});
      else
        reply_error(s, ApiError{status, "no route " + q.method + " " + q.path, "",
                                status == 404 ? "not_found_error" : "invalid_request_error"});
      s.status = status;
    });
  }
};

Result<std::pair<std::string, int>> parse_bind(const std::string& s, const std::string& what) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    return invalid_input(what + " " + s + ": expected HOST:PORT, e.g. 127.0.0.1:8000 (port 0: any free port)");
  const std::string host = s.substr(0, colon), port_s = s.substr(colon + 1);
  size_t used = 0;
  long port = -1;
  try {
    port = std::stol(port_s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != port_s.size() || port < 0 || port > 65535)
    return invalid_input(what + " " + s + ": the port '" + port_s + "' is not a number in [0, 65535]");
  return std::make_pair(host, static_cast<int>(port));
}

OpenAiServer::OpenAiServer(std::shared_ptr<actors::ServeEngine> engine,
                           std::shared_ptr<const io::Tokenizer> tokenizer,
                           std::shared_ptr<const io::ChatTemplate> chat_template, int32_t bos_id, int32_t eos_id,
                           OpenAiServerOptions options)
    : engine_(std::move(engine)), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.engine = engine_.get();
  m.tok = std::move(tokenizer);
  m.tmpl = std::move(chat_template);
  m.bos = bos_id;
  m.eos = eos_id;
  m.opt = std::move(options);
  if (eos_id >= 0) m.chat_stops.push_back(eos_id);
  for (const char* t : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>"}) {
    const int32_t id = m.tok->token_id(t);
    if (id >= 0 && std::find(m.chat_stops.begin(), m.chat_stops.end(), id) == m.chat_stops.end())
      m.chat_stops.push_back(id);
  }
  const int threads = m.opt.http_threads > 0 ? m.opt.http_threads
                      : m.opt.max_queue >= 0 ? engine_->slots() + m.opt.max_queue + 8
                                             : engine_->slots() + 16;
  m.http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  m.http.set_payload_max_length(m.opt.max_body_bytes);
  // A client that stalls while sending its request or reading the reply is dropped after this.
  const time_t io_s = m.opt.request_timeout_s > 0 && m.opt.request_timeout_s < 60
                          ? static_cast<time_t>(std::ceil(m.opt.request_timeout_s)) : 60;
  m.http.set_read_timeout(io_s, 0);
  m.http.set_write_timeout(io_s, 0);
  m.routes();
}

OpenAiServer::~OpenAiServer() { stop(); }

Result<int> OpenAiServer::bind(const std::string& host, int port) {
  int bound = -1;
  // cpp-httplib listens with a backlog of 5 (compiled in): a burst of concurrent clients overflows
  // it and the connections past it are reset. Keep the listening socket and listen again with room.
  int listening = -1;
  impl_->http.set_socket_options([&listening](socket_t sock) {
    httplib::default_socket_options(sock);
    listening = static_cast<int>(sock);
  });
  if (port == 0) {
    bound = impl_->http.bind_to_any_port(host);
  } else if (impl_->http.bind_to_port(host, port)) {
    bound = port;
  }
  impl_->http.set_socket_options(httplib::default_socket_options);
  if (bound > 0 && listening >= 0) (void)::listen(listening, 1024);
  if (bound <= 0)
    return make_error(ErrorCode::io, "cannot listen on " + host + ":" + std::to_string(port) +
                                         " (address in use or not this machine's)");
  return bound;
}

Status OpenAiServer::serve() {
  if (!impl_->http.listen_after_bind()) return make_error(ErrorCode::io, "the HTTP server stopped with an error");
  return {};
}

bool OpenAiServer::serving() const { return impl_ && impl_->http.is_running(); }

void OpenAiServer::begin_drain() { impl_->draining.store(true); }

int OpenAiServer::in_flight() const { return impl_->admitted_requests.load(); }

void OpenAiServer::stop() {
  if (impl_ && impl_->http.is_running()) impl_->http.stop();
}

}  // namespace troupe::serve
