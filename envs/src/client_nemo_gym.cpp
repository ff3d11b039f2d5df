// The nemo_gym EnvClient: a NeMo Gym resource server over HTTP (cpp-httplib), at `url:` or started
// from `command:` (troupe picks a free port for {port}, waits until GET / answers, and stops the
// process group at the end). Per episode: POST /seed_session with the task row (the answer's
// session cookie goes with every later call of that episode), each tool call of a model turn as
// POST /<tool> (a non-2xx answer is shown to the model and counted), and after the last turn
// POST /verify with the Responses-API output, whose `reward` and `reward_components` are the
// episode's. Every call has the deadline timeout_s, and an answer is read up to max_message_bytes.
// Calls run concurrently (concurrent() is true).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "bounded_http.h"
#include "child_process.h"
#include "troupe/base/clock.h"
#include "troupe/envs/client.h"
#include "troupe/envs/nemo_gym.h"
#include "troupe/envs/tools.h"

namespace troupe::envs {

namespace {

using Cookies = std::map<std::string, std::string>;

struct HttpAnswer {
  int status = 0;
  std::string body;
};

// A free TCP port on 127.0.0.1 (bound and released; the server binds it right after).
Result<int> free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return make_error(ErrorCode::io, std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  if (port <= 0) return make_error(ErrorCode::io, "cannot find a free port on 127.0.0.1");
  return port;
}

// Keeps the name=value of each Set-Cookie header (a cookie set to expire is dropped).
void take_cookies(const httplib::Headers& headers, Cookies& jar) {
  auto range = headers.equal_range("Set-Cookie");
  for (auto it = range.first; it != range.second; ++it) {
    const std::string& v = it->second;
    size_t eq = v.find('='), semi = v.find(';');
    if (eq == std::string::npos || (semi != std::string::npos && eq > semi)) continue;
    std::string name = trim(v.substr(0, eq)), value = v.substr(eq + 1, semi == std::string::npos ? std::string::npos : semi - eq - 1);
    std::string attrs = semi == std::string::npos ? "" : v.substr(semi);
    for (auto& c : attrs) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (attrs.find("max-age=0") != std::string::npos) jar.erase(name);
    else jar[name] = value;
  }
}

std::string cookie_header(const Cookies& jar) {
  std::string out;
  for (const auto& [k, v] : jar) out += (out.empty() ? "" : "; ") + k + "=" + v;
  return out;
}

class NemoGymClient final : public EnvClient {
 public:
  NemoGymClient(EnvSpec spec, nemo_gym::Settings settings, nemo_gym::Splits splits)
      : spec_(std::move(spec)), settings_(std::move(settings)), splits_(std::move(splits)) {
    info_.name = spec_.name;
    info_.version = "nemo_gym";
    info_.multi_turn = settings_.max_turns > 1;
    info_.max_turns = settings_.max_turns;
    std::set<std::string> seen;
    for (const auto* part : {&splits_.train, &splits_.eval})
      for (const auto& t : *part)
        for (auto& tool : nemo_gym::tools_of(t.row))
          if (seen.insert(tool.name).second) info_.tools.push_back(std::move(tool));
  }

  ~NemoGymClient() override { stop_server(); }

  Status start() {
    if (!spec_.command.empty()) {
      TROUPE_ASSIGN_OR_RETURN(int port, free_port());
      base_url_ = "http://127.0.0.1:" + std::to_string(port);
      TROUPE_TRY(spawn(port));
    } else {
      base_url_ = spec_.url;
      while (!base_url_.empty() && base_url_.back() == '/') base_url_.pop_back();
      if (base_url_.rfind("http://", 0) != 0 || base_url_.find('/', 7) != std::string::npos)
        return invalid_input("env " + spec_.name + ": url '" + spec_.url +
                             "' must be http://HOST:PORT (a resource server's root; https and paths are not supported)");
    }
    // ready once GET / answers at all (NeMo Gym servers answer {"status": "ok"})
    const double deadline = mono_seconds() + spec_.startup_timeout_s;
    std::string last = "no answer";
    while (true) {
      httplib::Client c(base_url_);
      c.set_connection_timeout(1, 0);
      c.set_read_timeout(2, 0);
      if (auto r = c.Get("/")) return {};
      else last = httplib::to_string(r.error());
      if (server_.pid() > 0 && !server_.alive()) {
        const int status = server_.exit_status();
        return make_error(WIFEXITED(status) && WEXITSTATUS(status) == 2 ? ErrorCode::invalid_input : ErrorCode::peer_failed,
                          "env " + spec_.name + ": the NeMo Gym server exited while starting (" +
                              detail::describe_wait_status(status) + ")" + server_.log_tail() + " [command: " +
                              server_.command_text() + "]");
      }
      if (mono_seconds() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    Error timed_out = make_error(ErrorCode::timeout, "env " + spec_.name + ": the NeMo Gym server at " + base_url_ +
                                                         " did not answer GET / within startup_timeout_s " +
                                                         std::to_string(spec_.startup_timeout_s) + " s (" + last + ")" +
                                                         server_.log_tail() +
                                                         (owns_server() ? " [command: " + server_.command_text() + "]" : ""));
    stop_server();
    return timed_out;
  }

  const EnvInfo& info() const override { return info_; }
  bool concurrent() const override { return true; }
  int worker_pid() const override { return server_.pid(); }
  bool gave_up() const override { return server_gone(); }

  Result<Observation> reset(const std::string& episode_id, uint64_t seed, const ResetOptions& options) override {
    const auto& rows = options.split == Split::eval ? splits_.eval : splits_.train;
    if (rows.empty())
      return invalid_input("env " + spec_.name + ": no " + split_name(options.split) +
                           " rows (set config.eval_data, or a larger eval_fraction)");
    const size_t index = static_cast<size_t>(seed % rows.size());
    Session s;
    s.task = &rows[index];
    s.index = index;
    s.eval = options.split == Split::eval;
    TROUPE_TRY(post("/seed_session", s.task->row, s.cookies, "seed_session of episode '" + episode_id + "'"));
    Observation o = nemo_gym::observation_of(s.task->row);
    o.metadata = {{"task", index}, {"split", split_name(options.split)}};
    std::lock_guard lock(mu_);
    sessions_[episode_id] = std::move(s);
    return o;
  }

  Result<StepResult> step(const std::string& episode_id, const std::string& action) override {
    Session s;
    {
      std::lock_guard lock(mu_);
      auto it = sessions_.find(episode_id);
      if (it == sessions_.end())
        return invalid_input("env " + spec_.name + ": step of unknown episode '" + episode_id + "' (reset it first)");
      s = it->second;  // the episode's calls are in order; keep the map unlocked while they run
    }
    const std::string what = "episode '" + episode_id + "'";
    ++s.turns;
    StepResult out;
    TROUPE_ASSIGN_OR_RETURN(bool called, run_turn(s, action, out, what));
    if (called && s.turns < settings_.max_turns) {
      std::lock_guard lock(mu_);
      sessions_[episode_id] = std::move(s);
      return out;
    }
    TROUPE_ASSIGN_OR_RETURN(VerifyResult v, verify_session(s, what));
    out.done = true;
    out.reward = v.reward;
    out.components = v.components;
    for (auto it = v.info.begin(); it != v.info.end(); ++it) out.info[it.key()] = *it;
    out.info["termination"] = called ? "max_turns" : "done";
    out.info["tool_calls_total"] = s.tool_calls;
    out.info["tool_errors"] = s.tool_errors;
    std::lock_guard lock(mu_);
    sessions_[episode_id] = std::move(s);
    return out;
  }

  // Single-turn scoring: a session of its own, the completion's tool calls run in order, then /verify.
  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    if (!metadata.is_object() || !metadata.contains("task") || !metadata["task"].is_number_integer() ||
        metadata["task"].get<int64_t>() < 0)
      return make_error(ErrorCode::internal, "env " + spec_.name + ": " + kProtocolErrorTag +
                                                 "verify metadata has no task index (it comes from this env's reset)");
    const bool eval = metadata.value("split", std::string("train")) == "eval";
    const auto& rows = eval ? splits_.eval : splits_.train;
    const size_t index = metadata["task"].get<size_t>();
    if (index >= rows.size())
      return make_error(ErrorCode::internal, "env " + spec_.name + ": " + kProtocolErrorTag + "verify metadata task " +
                                                 std::to_string(index) + " is not a row of this env");
    Session s;
    s.task = &rows[index];
    s.index = index;
    s.eval = eval;
    const std::string what = "verify of task " + std::to_string(index);
    TROUPE_TRY(post("/seed_session", s.task->row, s.cookies, what));
    StepResult ignored;
    TROUPE_TRY(run_turn(s, completion, ignored, what));
    TROUPE_ASSIGN_OR_RETURN(VerifyResult v, verify_session(s, what));
    v.info["tool_calls_total"] = s.tool_calls;
    v.info["tool_errors"] = s.tool_errors;
    return v;
  }

  void release(const std::string& episode_id) override {
    std::lock_guard lock(mu_);
    sessions_.erase(episode_id);
  }

  Result<json> aggregate_eval() override {
    json responses;
    {
      std::lock_guard lock(mu_);
      responses = std::move(eval_responses_);
      eval_responses_ = json::array();
    }
    if (responses.empty()) return json::object();
    std::map<size_t, int> rollouts;  // each (task, rollout) pair once, as NeMo Gym's profiler keys them
    for (auto& r : responses) r["_ng_rollout_index"] = rollouts[r["_ng_task_index"].get<size_t>()]++;
    Cookies none;
    TROUPE_ASSIGN_OR_RETURN(HttpAnswer a, post("/aggregate_metrics", {{"verify_responses", responses}}, none,
                                               "aggregate_metrics"));
    json j = json::parse(a.body, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return make_error(ErrorCode::internal, "env " + spec_.name + ": " + kProtocolErrorTag +
                                                 "/aggregate_metrics did not answer a JSON object");
    json out = json::object();
    for (const char* part : {"agent_metrics", "key_metrics"})
      if (j.contains(part) && j[part].is_object())
        for (auto it = j[part].begin(); it != j[part].end(); ++it)
          if (it->is_number()) out[it.key()] = *it;
    out["episodes"] = responses.size();
    return out;
  }

 private:
  struct Session {
    const nemo_gym::Task* task = nullptr;
    size_t index = 0;
    bool eval = false;
    Cookies cookies;
    nemo_gym::Output output;
    int turns = 0, tool_calls = 0, tool_errors = 0;
  };

  // Records one model turn and runs its tool calls; true when the turn called a tool.
  Result<bool> run_turn(Session& s, const std::string& turn, StepResult& out, const std::string& what) {
    std::vector<std::string> ids;
    auto calls = s.output.add_turn(turn, ids);
    if (calls.empty()) return false;
    json records = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      ToolCall& c = calls[i];
      ++s.tool_calls;
      if (c.ok) {
        TROUPE_ASSIGN_OR_RETURN(HttpAnswer a, post("/" + c.name, c.arguments, s.cookies, what + ": tool " + c.name,
                                                   /*any_status=*/true));
        c.ok = a.status >= 200 && a.status < 300;
        c.result = c.ok ? a.body : "HTTP " + std::to_string(a.status) + ": " + a.body;
        s.output.add_tool_output(ids[i], a.body);
      }
      if (!c.ok) ++s.tool_errors;
      out.observation.text += format_tool_result(c);
      records.push_back(to_json(c));
    }
    out.observation.messages.push_back({"tool", out.observation.text});
    out.info["tool_calls"] = records;
    return true;
  }

  Result<VerifyResult> verify_session(Session& s, const std::string& what) {
    const json& row = s.task->row;
    TROUPE_ASSIGN_OR_RETURN(HttpAnswer a, post("/verify", nemo_gym::verify_body(row, s.output.response(row)), s.cookies,
                                               what + ": verify"));
    json answer = json::parse(a.body, nullptr, false);
    TROUPE_ASSIGN_OR_RETURN(VerifyResult v, nemo_gym::read_verify(answer, row, "env " + spec_.name + ": " + what));
    if (s.eval) {  // kept for /aggregate_metrics (without the echoed request)
      json kept = answer;
      kept.erase("response");
      kept.erase("responses_create_params");
      kept["_ng_task_index"] = s.index;
      std::lock_guard lock(mu_);
      eval_responses_.push_back(std::move(kept));
    }
    return v;
  }

  // POST path with a JSON body and the session's cookies; the answer's cookies are kept. Not 2xx
  // is an error unless any_status; no answer within timeout_s is a timeout.
  Result<HttpAnswer> post(const std::string& path, const json& body, Cookies& cookies, const std::string& what,
                          bool any_status = false) {
    const std::string where = "env " + spec_.name + ": " + what + ": POST " + base_url_ + path;
    if (server_gone())
      return make_error(ErrorCode::peer_failed, where + ": the NeMo Gym server troupe started has exited" + server_.log_tail());
    httplib::Client c(base_url_);
    const auto secs = static_cast<time_t>(spec_.timeout_s);
    const auto usecs = static_cast<time_t>((spec_.timeout_s - static_cast<double>(secs)) * 1e6);
    c.set_connection_timeout(secs, usecs);
    c.set_read_timeout(secs, usecs);
    c.set_write_timeout(secs, usecs);
    httplib::Headers headers;
    if (!cookies.empty()) headers.emplace("Cookie", cookie_header(cookies));
    auto r = detail::bounded_post(c, path, headers, body.dump(-1, ' ', false, json::error_handler_t::replace),
                                  static_cast<size_t>(spec_.max_message_bytes), spec_.timeout_s);
    if (r.too_large)
      return make_error(ErrorCode::internal, "env " + spec_.name + ": " + kProtocolErrorTag + what + ": POST " + base_url_ +
                                                 path + ": the answer is larger than max_message_bytes " +
                                                 std::to_string(spec_.max_message_bytes) + " (not read further)");
    if (!r.ok) {
      auto e = r.error;
      if (r.past_deadline || e == httplib::Error::ConnectionTimeout ||
          (e == httplib::Error::Read && r.seconds >= 0.9 * spec_.timeout_s))
        return make_error(ErrorCode::timeout, where + ": no answer within timeout_s " + std::to_string(spec_.timeout_s) + " s");
      if (server_gone())
        return make_error(ErrorCode::peer_failed, where + ": the NeMo Gym server troupe started has exited" + server_.log_tail());
      return make_error(ErrorCode::io, where + ": " + httplib::to_string(e));
    }
    take_cookies(r.headers, cookies);
    if (!any_status && (r.status < 200 || r.status >= 300)) {
      std::string b = r.body.size() > 400 ? r.body.substr(0, 400) + "..." : r.body;
      return make_error(ErrorCode::internal, where + ": HTTP " + std::to_string(r.status) + ": " + b);
    }
    return HttpAnswer{r.status, std::move(r.body)};
  }

  // ---- the server process troupe started ----
  bool owns_server() const { return !spec_.command.empty(); }

  Status spawn(int port) {
    detail::ChildOptions o;
    o.argv = spec_.command;
    for (auto& a : o.argv)
      for (const auto& [key, value] : {std::pair<std::string, std::string>{"{port}", std::to_string(port)},
                                       {"{host}", "127.0.0.1"}, {"{url}", base_url_}})
        for (size_t p; (p = a.find(key)) != std::string::npos;) a.replace(p, key.size(), value);
    o.env.assign(spec_.environment.begin(), spec_.environment.end());
    o.env.emplace_back("TROUPE_NEMO_GYM_PORT", std::to_string(port));
    if (!settings_.server_config.empty())  // the server's own config fields (nemo_gym_serve.py reads them)
      o.env.emplace_back("TROUPE_NEMO_GYM_SERVER_CONFIG", settings_.server_config.dump());
    o.cwd = spec_.cwd;
    o.stdout_to_null = true;
    detail::place_log(o, spec_.log_dir, spec_.name);  // with a run's logs/: stdout and stderr kept there
    o.own_group = true;  // stopping it stops its children
    return server_.start(std::move(o), "env " + spec_.name);
  }

  bool server_gone() const { return owns_server() && !server_.alive(); }

  // SIGTERM to its process group, two seconds to exit, then SIGKILL.
  void stop_server() { server_.stop(2.0, SIGTERM); }

  EnvSpec spec_;
  nemo_gym::Settings settings_;
  nemo_gym::Splits splits_;
  EnvInfo info_;
  std::string base_url_;
  mutable detail::ChildProcess server_;  // started from spec_.command (owns_server()); removes its log
  std::mutex mu_;  // sessions_, eval_responses_
  std::map<std::string, Session> sessions_;
  json eval_responses_ = json::array();
};

}  // namespace

Result<std::unique_ptr<EnvClient>> make_nemo_gym_client(const EnvSpec& spec) {
  const std::string where = "env " + spec.name;
  TROUPE_ASSIGN_OR_RETURN(auto settings, nemo_gym::read_settings(spec.config, where + ": config"));
  if (spec.command.empty() && !settings.server_config.empty())
    return invalid_input(where + ": config.server_config is for a server troupe starts (command:); set a running "
                                 "server's config where it is started");
  TROUPE_ASSIGN_OR_RETURN(auto splits, nemo_gym::load_splits(settings, where));
  auto client = std::make_unique<NemoGymClient>(spec, std::move(settings), std::move(splits));
  TROUPE_TRY(client->start());
  return std::unique_ptr<EnvClient>(std::move(client));
}

}  // namespace troupe::envs
