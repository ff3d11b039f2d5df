// The server half of the remote env protocol: a REP socket in front of an in-process EnvClient.
// A bad request gets an error reply naming what is wrong; the server itself never stops for one.
#include <unistd.h>

#include <cerrno>

#include <zmq.hpp>

#include "troupe/envs/plugin.h"
#include "troupe/envs/remote.h"

namespace troupe::envs {

namespace {

const char* code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::invalid_input: return "invalid_input";
    case ErrorCode::peer_failed: return "peer_failed";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::io: return "io";
    case ErrorCode::internal: return "internal";
  }
  return "internal";
}

json error_reply(const json& id, ErrorCode code, const std::string& message) {
  return {{"ok", false}, {"id", id}, {"error", {{"code", code_name(code)}, {"message", message}}}};
}

}  // namespace

json EnvRequestHandler::handle(const json& req) {
  if (!req.is_object()) return error_reply(nullptr, ErrorCode::invalid_input, "request must be a JSON object");
  const json id = req.value("id", json(nullptr));
  if (!req.contains("op") || !req["op"].is_string())
    return error_reply(id, ErrorCode::invalid_input, "request has no string 'op'");
  const std::string op = req["op"].get<std::string>();
  auto session = [&]() -> Result<std::string> {
    if (!req.contains("session") || !req["session"].is_string())
      return invalid_input(op + ": request needs a string 'session' (the episode id)");
    return req["session"].get<std::string>();
  };
  auto ok = [&](json result) { return json{{"ok", true}, {"id", id}, {"result", std::move(result)}}; };
  auto fail = [&](const Error& e) { return error_reply(id, e.code, e.message); };

  if (op == "hello") return ok({{"protocol", kEnvProtocol}, {"env", to_json(local_->info())}});
  if (op == "shutdown") {
    shutdown_ = true;
    return ok(json::object());
  }
  if (op == "reset") {
    auto s = session();
    if (!s.ok()) return fail(s.error());
    uint64_t seed = 0;
    if (req.contains("seed")) {
      if (!req["seed"].is_number_unsigned() && !(req["seed"].is_number_integer() && req["seed"].get<int64_t>() >= 0))
        return fail(invalid_input("reset: 'seed' must be a non-negative integer"));
      seed = req["seed"].get<uint64_t>();
    }
    auto opts = reset_options_from_json(req.value("options", json(nullptr)), "reset: options");
    if (!opts.ok()) return fail(opts.error());
    auto obs = local_->reset(*s, seed, *opts);
    return obs.ok() ? ok(to_json(*obs)) : fail(obs.error());
  }
  if (op == "step") {
    auto s = session();
    if (!s.ok()) return fail(s.error());
    if (!req.contains("action") || !req["action"].is_string()) return fail(invalid_input("step: request needs a string 'action'"));
    auto r = local_->step(*s, req["action"].get<std::string>());
    return r.ok() ? ok(to_json(*r)) : fail(r.error());
  }
  if (op == "verify") {
    if (!req.contains("completion") || !req["completion"].is_string())
      return fail(invalid_input("verify: request needs a string 'completion'"));
    json meta = req.value("metadata", json::object());
    if (meta.is_null()) meta = json::object();
    if (!meta.is_object()) return fail(invalid_input("verify: 'metadata' must be an object"));
    auto r = local_->verify(meta, req["completion"].get<std::string>());
    return r.ok() ? ok(to_json(*r)) : fail(r.error());
  }
  if (op == "release") {
    auto s = session();
    if (!s.ok()) return fail(s.error());
    local_->release(*s);
    return ok(json::object());
  }
  return fail(invalid_input("unknown op '" + op + "' (expected hello, reset, step, verify, release, shutdown)"));
}

Status serve_env(std::unique_ptr<EnvClient> local, const ServeOptions& options) {
  const std::string name = local->info().name;
  EnvRequestHandler handler(std::move(local));
  try {
    static auto* ctx = new zmq::context_t(1);
    zmq::socket_t sock(*ctx, zmq::socket_type::rep);
    sock.set(zmq::sockopt::linger, 0);
    if (options.max_message_bytes > 0) sock.set(zmq::sockopt::maxmsgsize, options.max_message_bytes);
    try {
      sock.bind(options.bind);
    } catch (const zmq::error_t& e) {
      return invalid_input("cannot bind env server to '" + options.bind + "': " + e.what());
    }
    if (options.announce) std::fprintf(stderr, "troupe env: serving %s on %s\n", name.c_str(), options.bind.c_str());
    while (!handler.shutdown_requested()) {
      if (options.stop && options.stop->load()) break;
      if (options.parent_pid > 0 && ::getppid() != options.parent_pid) break;  // orphaned worker
      zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, std::chrono::milliseconds(options.poll_ms));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;  // a signal (SIGTERM/SIGINT): look at the stop flag again
        throw;
      }
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t msg;
      if (!sock.recv(msg, zmq::recv_flags::none)) continue;
      json req = json::parse(msg.to_string_view(), nullptr, false);
      json reply = req.is_discarded() ? error_reply(nullptr, ErrorCode::invalid_input, "request is not valid JSON")
                                      : handler.handle(req);
      const std::string text = reply.dump(-1, ' ', false, json::error_handler_t::replace);
      sock.send(zmq::buffer(text), zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::io, "env server on '" + options.bind + "': ZeroMQ error: " + e.what());
  }
  if (options.bind.starts_with("ipc://")) ::unlink(options.bind.c_str() + 6);  // bound by us: leave no socket file
  return {};
}

Result<std::unique_ptr<EnvClient>> make_served_env(const std::string& target, const std::string& config_json) {
  json config = json::object();
  if (!config_json.empty()) {
    config = json::parse(config_json, nullptr, false);
    if (config.is_discarded() || !config.is_object())
      return invalid_input("env config must be a JSON object, got: " + config_json.substr(0, 200));
  }
  const bool is_plugin = target.find('/') != std::string::npos || target.ends_with(".so");
  if (is_plugin) {
    TROUPE_ASSIGN_OR_RETURN(EnvFactory f, plugin_factory(target));
    return make_local_client(std::move(f), config);
  }
  TROUPE_ASSIGN_OR_RETURN(EnvFactory f, EnvRegistry::global().factory(target));
  return make_local_client(std::move(f), config);
}

}  // namespace troupe::envs
