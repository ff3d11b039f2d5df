// The verifiers (v1) environment server client (client.h, make_verifiers_client). Wire: a DEALER
// socket sends [request_id, method, msgpack payload]; the server's ROUTER answers with any number
// of [request_id, "delta", msgpack trace delta] frames and one [request_id, "reply", msgpack
// response]. Methods: `health` ({}), `run` ({task_data, client, model, sampling}), `cancel`
// ({request_id}). A run's reward is in its trace deltas (each trace's `rewards`: name ->
// {score, weight}); the reply carries the episode head and each trace's node/call counts, which
// the assembled deltas must match. Every call has its own socket and deadline, so episodes run
// concurrently; a run past timeout_s is cancelled on the server. The model endpoint and name are
// the caller's (RunRequest): the coordinator sends a generator's base URL and "episodes/ID".
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <zmq.hpp>

#include "connection_watch.h"
#include "msgpack_json.h"
#include "troupe/base/clock.h"
#include "troupe/base/build_config.h"
#include "verifiers_tasks.h"
#include "troupe/envs/client.h"

namespace troupe::envs {

namespace {

zmq::context_t& verifiers_context() {
  static auto* ctx = new zmq::context_t(1);  // never destroyed: sockets may outlive static teardown
  return *ctx;
}

std::string request_id() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) s.push_back(hex[rng() % 16]);
  return s;
}

Error protocol_error(const std::string& where, const std::string& what) {
  return Error{ErrorCode::internal, where + ": " + kProtocolErrorTag + what};
}

// What the deltas of one trace said so far.
struct TraceState {
  size_t nodes = 0, calls = 0;
  json rewards = json::object(), metrics = json::object();
  bool ok = false, is_timeout = false;
  std::string stop_condition, last_error;
};

class VerifiersEnvClient final : public EnvClient {
 public:
  explicit VerifiersEnvClient(EnvSpec spec) : spec_(std::move(spec)) {
    info_.name = spec_.name;
    info_.version = "verifiers-v1";
  }

  Status start() {
    TROUPE_TRY(read_config());
    // the server may still be loading its environment: ask until startup_timeout_s
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(spec_.startup_timeout_s * 1000));
    std::string last;
    for (;;) {
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) break;
      auto r = call("health", json::object(), std::min(left, 2.0), nullptr);
      if (r.ok() && r->is_object() && r->value("success", false)) return {};
      last = r.ok() ? "answered " + r->dump() : r.error().message;
      if (!r.ok() && r.error().code != ErrorCode::timeout) break;
    }
    return make_error(ErrorCode::peer_failed, where() + ": the env server did not answer `health` within " +
                                                  std::to_string(spec_.startup_timeout_s) + " s (" + last +
                                                  "); is it running at that address?");
  }

  const EnvInfo& info() const override { return info_; }
  bool concurrent() const override { return true; }
  bool runs_episodes() const override { return true; }

  Result<Observation> reset(const std::string& episode_id, uint64_t seed, const ResetOptions& options) override {
    const auto& rows = options.split == Split::eval ? eval_ : train_;
    if (rows.empty())
      return invalid_input(where() + ": no " + split_name(options.split) + " tasks for episode '" + episode_id +
                           "' (config.tasks / config.eval_tasks)");
    const json& row = rows[seed % rows.size()];
    Observation o;
    o.text = prompt_text(row);
    o.metadata = {{"task_data", row}};
    if (row.contains("answer")) o.metadata["answer"] = row["answer"];
    return o;
  }

  Result<StepResult> step(const std::string& episode_id, const std::string&) override {
    return invalid_input(where() + ": episode '" + episode_id + "': a verifiers env runs its turns itself (no step)");
  }
  Result<VerifyResult> verify(const json&, const std::string&) override {
    return invalid_input(where() + ": a verifiers env scores the episodes it runs (no verify)");
  }
  void release(const std::string&) override {}

  Result<RunResult> run(const std::string& episode_id, const RunRequest& req) override {
    const json task = req.metadata.is_object() ? req.metadata.value("task_data", json()) : json();
    if (!task.is_object()) return invalid_input(where() + ": episode '" + episode_id + "' has no task data");
    json sampling = req.sampling;
    for (auto it = sampling_.begin(); it != sampling_.end(); ++it) sampling[it.key()] = it.value();
    // One client config per endpoint (the server keeps one HTTP client per distinct config): the
    // episode travels in the model name, which the endpoint reads (req.model, e.g. "episodes/ID").
    json client = {{"type", "eval"}, {"base_url", req.base_url}, {"api_key_var", api_key_var_}};
    json payload = {{"task_data", task}, {"client", client}, {"model", req.model}, {"sampling", sampling}};
    const std::string what = where() + ": run of episode '" + episode_id + "'";
    std::map<std::string, TraceState> traces;
    auto on_delta = [&](const json& d) -> Status {
      if (!d.is_object() || !d.contains("trace") || !d["trace"].is_string())
        return protocol_error(what, "a delta without its 'trace' id: " + d.dump().substr(0, 200));
      const std::string id = d["trace"].get<std::string>();
      if (d.value("discard", false)) {
        traces.erase(id);
        return {};
      }
      TraceState& t = traces[id];
      for (const char* list : {"nodes", "calls", "errors"}) {
        if (!d.contains(list)) continue;
        if (!d[list].is_array()) return protocol_error(what, std::string("delta '") + list + "' is not a list");
        if (std::string(list) == "nodes") t.nodes += d[list].size();
        if (std::string(list) == "calls") t.calls += d[list].size();
        if (std::string(list) == "errors" && !d[list].empty()) {
          const json& e = d[list].back();
          t.last_error = e.is_object() ? e.value("type", std::string("error")) + ": " + e.value("message", std::string())
                                       : e.dump();
        }
      }
      if (d.contains("set")) {
        const json& s = d["set"];
        if (!s.is_object()) return protocol_error(what, "delta 'set' is not a mapping");
        if (s.contains("rewards")) {
          if (!s["rewards"].is_object()) return protocol_error(what, "trace 'rewards' is not a mapping");
          t.rewards = s["rewards"];
        }
        if (s.contains("metrics") && s["metrics"].is_object()) t.metrics = s["metrics"];
        if (s.contains("ok") && s["ok"].is_boolean()) t.ok = s["ok"].get<bool>();
        if (s.contains("is_timeout") && s["is_timeout"].is_boolean()) t.is_timeout = s["is_timeout"].get<bool>();
        if (s.contains("stop_condition") && s["stop_condition"].is_string())
          t.stop_condition = s["stop_condition"].get<std::string>();
      }
      return {};
    };
    TROUPE_ASSIGN_OR_RETURN(json rep, call("run", payload, spec_.timeout_s, on_delta));
    return result_of(rep, traces, what);
  }

 private:
  std::string where() const { return "env " + spec_.name + " (verifiers server " + spec_.address + ")"; }

  static std::string prompt_text(const json& row) {
    const json p = row.value("prompt", json());
    if (p.is_string()) return p.get<std::string>();
    std::string text;
    if (p.is_array())
      for (const auto& m : p)
        if (m.is_object() && m.contains("content") && m["content"].is_string())
          text += (text.empty() ? "" : "\n") + m["content"].get<std::string>();
    return text;
  }

  // config.taskset (and eval_taskset): the taskset's own load(), read by a Python child; eval_size
  // holds out that many of the last train tasks when there is no eval set.
  Status load_tasksets() {
    const json& c = spec_.config;
    const std::string where = "env " + spec_.name;
    std::string python = troupe::python_executable();
    if (c.contains("python")) {
      if (!c["python"].is_string() || c["python"].get<std::string>().empty())
        return invalid_input(where + ": config.python must be the path of a Python interpreter");
      python = c["python"].get<std::string>();
    }
    int max_tasks = 0, eval_size = 0;
    for (auto [key, out] : {std::pair<const char*, int*>{"max_tasks", &max_tasks}, {"eval_size", &eval_size}}) {
      if (!c.contains(key)) continue;
      if (!c[key].is_number_integer() || c[key].get<int64_t>() < 0 || c[key].get<int64_t>() > 100000000)
        return invalid_input(where + ": config." + key + " must be an integer >= 0");
      *out = c[key].get<int>();
    }
    for (auto [key, out] : {std::pair<const char*, std::vector<json>*>{"taskset", &train_}, {"eval_taskset", &eval_}}) {
      if (!c.contains(key)) continue;
      if (!c[key].is_object() || !c[key].contains("id") || !c[key]["id"].is_string())
        return invalid_input(where + ": config." + key + " must be a verifiers taskset config with its 'id'");
      if (c.contains(key == std::string("taskset") ? "tasks" : "eval_tasks"))
        return invalid_input(where + ": config." + key + " and inline " + (key == std::string("taskset") ? "tasks" : "eval_tasks") + " exclude each other");
      TROUPE_ASSIGN_OR_RETURN(*out, detail::load_verifiers_taskset(spec_, c[key], python, max_tasks, where));
    }
    if (eval_size > 0) {
      if (!eval_.empty()) return invalid_input(where + ": config.eval_size is for a taskset without eval tasks");
      if (static_cast<size_t>(eval_size) >= train_.size())
        return invalid_input(where + ": config.eval_size " + std::to_string(eval_size) + " leaves no train task of " +
                             std::to_string(train_.size()));
      eval_.assign(train_.end() - eval_size, train_.end());
      train_.resize(train_.size() - static_cast<size_t>(eval_size));
    }
    return {};
  }

  Status read_config() {
    static const std::set<std::string> known = {"tasks", "eval_tasks", "sampling", "api_key_var", "taskset",
                                                "eval_taskset", "eval_size", "max_tasks", "python"};
    for (auto it = spec_.config.begin(); it != spec_.config.end(); ++it)
      if (!known.count(it.key()))
        return invalid_input("env " + spec_.name + ": config: unknown key '" + it.key() +
                             "' (known: tasks, eval_tasks, sampling, api_key_var, taskset, eval_taskset, eval_size, "
                             "max_tasks, python)");
    auto rows = [&](const char* key, std::vector<json>& out) -> Status {
      if (!spec_.config.contains(key)) return {};
      const json& v = spec_.config[key];
      if (!v.is_array()) return invalid_input("env " + spec_.name + ": config." + key + " must be a list of task mappings");
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_object())
          return invalid_input("env " + spec_.name + ": config." + key + "[" + std::to_string(i) +
                               "] must be a mapping (the verifiers TaskData: prompt, answer, ...)");
        out.push_back(v[i]);
      }
      return {};
    };
    TROUPE_TRY(rows("tasks", train_));
    TROUPE_TRY(rows("eval_tasks", eval_));
    TROUPE_TRY(load_tasksets());
    if (train_.empty())
      return invalid_input("env " + spec_.name + ": config.tasks: a verifiers env needs its tasks (inline, or config.taskset: its taskset's own)");
    if (eval_.empty()) eval_ = train_;
    auto str = [&](const char* key, std::string& out) -> Status {
      if (!spec_.config.contains(key)) return {};
      if (!spec_.config[key].is_string()) return invalid_input("env " + spec_.name + ": config." + key + " must be a string");
      out = spec_.config[key].get<std::string>();
      return {};
    };
    TROUPE_TRY(str("api_key_var", api_key_var_));
    if (spec_.config.contains("sampling")) {
      if (!spec_.config["sampling"].is_object())
        return invalid_input("env " + spec_.name + ": config.sampling must be a mapping");
      sampling_ = spec_.config["sampling"];
    }
    return {};
  }

  // One request on a socket of its own: its deltas go to on_delta, its reply is returned.
  Result<json> call(const std::string& method, const json& payload, double timeout_s,
                    const std::function<Status(const json&)>& on_delta) {
    zmq::socket_t sock(verifiers_context(), zmq::socket_type::dealer);
    sock.set(zmq::sockopt::linger, 200);
    // a message over the limit is never read: libzmq drops the connection, and the call times out
    sock.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(spec_.max_message_bytes));
    ConnectionWatch watch(verifiers_context(), sock);  // which connection was dropped, and when
    try {
      sock.connect(spec_.address);
    } catch (const zmq::error_t& e) {
      return invalid_input(where() + ": cannot connect: " + e.what());
    }
    const std::string rid = request_id();
    const std::string body = json_to_msgpack(payload);
    sock.send(zmq::buffer(rid), zmq::send_flags::sndmore);
    sock.send(zmq::buffer(method), zmq::send_flags::sndmore);
    sock.send(zmq::buffer(body), zmq::send_flags::none);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    const double sent = mono_seconds();
    const std::string what = where() + ": " + method;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      zmq::pollitem_t items[] = {{static_cast<void*>(sock), 0, ZMQ_POLLIN, 0}, {watch.handle(), 0, ZMQ_POLLIN, 0}};
      const int ready = left.count() > 0 ? zmq::poll(items, 2, left) : 0;
      if (items[1].revents & ZMQ_POLLIN) {
        watch.drain();
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
      }
      if (ready == 0) {
        if (method == "run") {  // tell the server to stop the abandoned rollout (best effort)
          const std::string cancel = json_to_msgpack(json{{"request_id", rid}});
          const std::string cid = request_id();
          sock.send(zmq::buffer(cid), zmq::send_flags::sndmore);
          sock.send(zmq::buffer(std::string("cancel")), zmq::send_flags::sndmore);
          sock.send(zmq::buffer(cancel), zmq::send_flags::dontwait);
        }
        watch.drain();
        return make_error(ErrorCode::timeout, what + ": no reply within timeout_s " + std::to_string(timeout_s) +
                                                  " s" + dropped_connection_note(watch, sent) +
                                                  " (the run was cancelled on the server; a message over max_message_bytes " +
                                                  std::to_string(spec_.max_message_bytes) +
                                                  " is dropped with its connection, unread)");
      }
      std::vector<zmq::message_t> frames;
      for (;;) {
        zmq::message_t m;
        (void)sock.recv(m, zmq::recv_flags::none);
        const bool more = m.more();
        frames.push_back(std::move(m));
        if (!more) break;
      }
      if (frames.size() != 3)
        return protocol_error(what, "a message of " + std::to_string(frames.size()) +
                                        " frames (expected [request_id, kind, data])");
      if (frames[0].to_string() != rid) continue;  // a late answer to an earlier request of this socket
      const std::string kind = frames[1].to_string();
      auto decoded = msgpack_to_json(frames[2].data(), frames[2].size());
      if (!decoded.ok()) return protocol_error(what, "undecodable " + kind + ": " + decoded.error().message);
      if (kind == "delta") {
        if (on_delta) TROUPE_TRY(on_delta(*decoded));
        continue;
      }
      if (kind != "reply") return protocol_error(what, "a frame of kind '" + kind + "' (expected delta or reply)");
      return std::move(decoded).value();
    }
  }

  Result<RunResult> result_of(const json& rep, const std::map<std::string, TraceState>& traces, const std::string& what) {
    if (!rep.is_object() || !rep.contains("success") || !rep["success"].is_boolean())
      return protocol_error(what, "the reply is not a response mapping with 'success': " + rep.dump().substr(0, 200));
    if (!rep["success"].get<bool>()) {
      const std::string err = rep.contains("error") && rep["error"].is_string() ? rep["error"].get<std::string>() : "?";
      return make_error(ErrorCode::internal, what + ": the env server failed the run: " + err);
    }
    if (!rep.contains("head") || !rep["head"].is_object() || !rep.contains("traces") || !rep["traces"].is_array())
      return protocol_error(what, "the reply has no 'head' mapping and 'traces' list");
    const json& head = rep["head"];
    RunResult out;
    std::string failed;
    bool timed_out = head.value("is_timeout", false);
    if (head.contains("errors") && head["errors"].is_array() && !head["errors"].empty()) {
      const json& e = head["errors"].back();
      failed = e.is_object() ? e.value("type", std::string("error")) + ": " + e.value("message", std::string()) : e.dump();
    }
    size_t calls = 0;
    std::string stop;
    for (const auto& s : rep["traces"]) {
      if (!s.is_object() || !s.contains("id") || !s["id"].is_string() || !s.contains("nodes") ||
          !s["nodes"].is_number_unsigned() || !s.contains("calls") || !s["calls"].is_number_unsigned())
        return protocol_error(what, "a trace summary is not {id, nodes, calls}: " + s.dump().substr(0, 200));
      auto it = traces.find(s["id"].get<std::string>());
      if (it == traces.end()) return protocol_error(what, "trace " + s["id"].get<std::string>() + " never streamed");
      const TraceState& t = it->second;
      if (t.nodes != s["nodes"].get<size_t>() || t.calls != s["calls"].get<size_t>())
        return protocol_error(what, "trace " + it->first + " streamed " + std::to_string(t.nodes) + " nodes / " +
                                        std::to_string(t.calls) + " calls, the reply says " + s["nodes"].dump() +
                                        " / " + s["calls"].dump());
      calls += t.calls;
      stop = t.stop_condition;
      timed_out = timed_out || t.is_timeout;
      if (!t.ok && failed.empty()) failed = t.last_error.empty() ? "the trace did not complete" : t.last_error;
      for (auto r = t.rewards.begin(); r != t.rewards.end(); ++r) {
        if (r->is_null()) continue;
        if (!r->is_object() || !r->contains("score") || !(*r)["score"].is_number())
          return protocol_error(what, "reward '" + r.key() + "' is not {score, weight}");
        const double w = r->contains("weight") && (*r)["weight"].is_number() ? (*r)["weight"].get<double>() : 1.0;
        const double v = (*r)["score"].get<double>() * w;
        out.reward += v;
        out.components[r.key()] += v;
      }
      for (auto m = t.metrics.begin(); m != t.metrics.end(); ++m)
        if (m->is_number()) out.components[m.key()] = m->get<double>();
    }
    if (rep["traces"].empty() && failed.empty()) failed = "the episode produced no trace";
    if (!failed.empty())
      return make_error(timed_out ? ErrorCode::timeout : ErrorCode::internal, what + ": the episode failed: " + failed);
    out.info = {{"stop_condition", stop}, {"traces", rep["traces"].size()}, {"model_calls", calls}};
    return out;
  }

  EnvSpec spec_;
  EnvInfo info_;
  std::vector<json> train_, eval_;
  std::string api_key_var_ = "TROUPE_VERIFIERS_API_KEY";
  json sampling_ = json::object();
};

}  // namespace

Result<std::unique_ptr<EnvClient>> make_verifiers_client(const EnvSpec& spec) {
  auto c = std::make_unique<VerifiersEnvClient>(spec);
  TROUPE_TRY(c->start());
  return std::unique_ptr<EnvClient>(std::move(c));
}

}  // namespace troupe::envs
