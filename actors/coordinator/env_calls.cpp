// Env calls that fail: a reset or verify that failed (the env's error, a crashed or hung worker,
// a malformed reply, an invalid reward, or the request itself timing out) is retried on the next
// env workers, up to envs[].max_retries; what still fails is that episode's failure, counted per
// reason in the step's row. The run stops only when a bound is crossed: more than
// envs[].max_failure_frac of one step's episodes of an env failed, all of them failed, or an env
// worker needed more than envs[].max_restarts restarts.
#include <map>

#include "coordinator_internal.h"
#include "troupe/envs/trajectory.h"

namespace troupe::actors::coord {

using runtime::request;

const EnvSpec& env_spec(const RunSetup& s, const std::string& name) {
  for (const auto& e : s.cfg.envs)
    if (e.name == name) return e;
  return s.cfg.envs.front();
}

namespace {
std::string reason_of(const Error& e) {
  return e.code == ErrorCode::timeout ? "timeout" : e.code == ErrorCode::peer_failed ? "worker_crash" : "env_error";
}
}  // namespace

EnvObs settled(Result<EnvObs> r) {
  if (r.ok()) return std::move(r).value();
  EnvObs o;
  o.error = r.error().message;
  o.reason = reason_of(r.error());
  return o;
}

Task<ResetOutcome> reset_retrying(RunState& s, const Result<EnvObs>& first, const EnvResetReq& req, size_t w,
                                  bool fresh_seed) {
  ResetOutcome out;
  out.obs = settled(first);
  out.episode_id = req.episode_id;
  out.worker = w;
  out.seed = req.seed;
  out.draw = req.draw;
  const int max_retries = env_spec(s, req.env).max_retries;
  const std::string base_id = req.episode_id;
  const uint64_t base_seed = req.seed;
  while (!out.obs.error.empty() && !out.obs.fatal && out.retries < max_retries) {
    ++out.retries;
    if (s.hooks.log) s.hooks.log("env '" + req.env + "': " + out.obs.reason + ": " + out.obs.error + "; retrying");
    (void)s.here->send(s.env_worker(out.worker), EnvReleaseReq{req.env, out.episode_id});
    out.worker = w + static_cast<size_t>(out.retries);
    out.episode_id = base_id + "-r" + std::to_string(out.retries);
    out.seed = fresh_seed ? mix_seed(base_seed, seed_stream::env_retry, static_cast<uint64_t>(out.retries)) : base_seed;
    // a fresh prompt is the env's next draw (the order is deterministic: one coroutine makes the
    // rollouts, step by step, and awaits its groups' resets in order)
    if (fresh_seed && req.draw >= 0) out.draw = s.next_draw(req.env);
    EnvResetReq again{req.env, out.episode_id, out.seed, req.split, out.draw};
    Result<EnvObs> got = co_await request<EnvObs>(s.here, s.env_worker(out.worker), std::move(again), kEnvTimeout);
    out.obs = settled(std::move(got));
  }
  co_return out;
}

Task<EnvVerifyRep> verify_retrying(RunState& s, const Result<EnvVerifyRep>& first, const EnvVerifyReq& req,
                                   size_t w, int* retries) {
  const size_t n = req.completions.size();
  EnvVerifyRep v;
  auto fill_failed = [&](EnvVerifyRep& x, const Error& e) {
    x = EnvVerifyRep{};
    for (size_t j = 0; j < n; ++j) {
      x.rewards.push_back(0);
      x.correct.push_back(0);
      x.errors.push_back(e.message);
      x.reasons.push_back(reason_of(e));
      x.components_json.emplace_back("{}");
      x.infos_json.emplace_back("{}");
    }
  };
  if (first.ok()) v = *first;
  else fill_failed(v, first.error());
  v.reasons.resize(n);
  v.components_json.resize(n, "{}");
  v.infos_json.resize(n, "{}");
  const int max_retries = env_spec(s, req.env).max_retries;
  for (int a = 1; a <= max_retries && !v.fatal; ++a) {
    std::vector<size_t> failed;
    for (size_t j = 0; j < n; ++j)
      if (!v.errors[j].empty()) failed.push_back(j);
    if (failed.empty()) break;
    if (s.hooks.log)
      s.hooks.log("env '" + req.env + "': " + std::to_string(failed.size()) + " verify call(s) failed (" +
                  v.reasons[failed[0]] + ": " + v.errors[failed[0]] + "); retrying");
    EnvVerifyReq again{req.env, req.metadata_json, {}};
    for (size_t j : failed) again.completions.push_back(req.completions[j]);
    *retries += static_cast<int>(failed.size());
    Result<EnvVerifyRep> r = co_await request<EnvVerifyRep>(s.here, s.env_worker(w + static_cast<size_t>(a)),
                                                            std::move(again), kEnvTimeout);
    EnvVerifyRep x;
    if (r.ok() && r->rewards.size() == failed.size()) x = std::move(r).value();
    else fill_failed(x, r.ok() ? Error{ErrorCode::internal, "verify reply has the wrong size"} : r.error());
    x.reasons.resize(failed.size());
    x.components_json.resize(failed.size(), "{}");
    x.infos_json.resize(failed.size(), "{}");
    for (size_t m = 0; m < failed.size(); ++m) {
      size_t j = failed[m];
      v.rewards[j] = x.rewards[m];
      v.correct[j] = x.correct[m];
      v.errors[j] = x.errors[m];
      v.reasons[j] = x.reasons[m];
      v.components_json[j] = x.components_json[m];
      v.infos_json[j] = x.infos_json[m];
    }
    v.fatal = v.fatal || x.fatal;
    v.judge_scorer.add(x.judge_scorer);
    v.reward_model_scorer.add(x.reward_model_scorer);
  }
  co_return v;
}

void EnvFailureCount::add(const std::string& error, const std::string& reason) {
  ++total;
  if (error.empty()) return;
  ++failed;
  ++reasons[reason.empty() ? "env_error" : reason];
  last = error;
}

Status check_failure_bound(RunState& s, const std::string& env, const EnvFailureCount& c, const std::string& where) {
  if (c.failed == 0) return {};
  std::string reasons;
  for (const auto& [reason, n] : c.reasons) reasons += (reasons.empty() ? "" : ", ") + reason + " " + std::to_string(n);
  const auto& spec = env_spec(s, env);
  const double frac = static_cast<double>(c.failed) / std::max(1, c.total);
  const bool past_restarts =
      c.last.find("env worker restarts") != std::string::npos && c.last.find("gave up after") != std::string::npos;
  std::string what = "env '" + env + "': " + std::to_string(c.failed) + " of " + std::to_string(c.total) +
                     " episodes of " + where + " failed after retries (" + reasons + "; last: " + c.last + ")";
  if (past_restarts)
    return make_error(ErrorCode::peer_failed, what + "; the env worker is past envs[].max_restarts (" +
                                                  std::to_string(spec.max_restarts) + ")");
  if (c.failed == c.total)
    return make_error(ErrorCode::peer_failed, what + "; every episode failed, so nothing could be " +
                                                  (where.rfind("step", 0) == 0 ? "trained on" : "scored"));
  if (frac > spec.max_failure_frac)
    return make_error(ErrorCode::peer_failed,
                      what + "; that is more than envs[].max_failure_frac " + std::to_string(spec.max_failure_frac));
  if (s.hooks.log) s.hooks.log(what + "; the run goes on");
  return {};
}

Status check_env_failures(RunState& s, const Rollout& r, int64_t step) {
  std::map<std::string, EnvFailureCount> per_env;
  for (const auto& g : r.groups) {
    auto& c = per_env[g.env];
    for (size_t j = 0; j < g.errors.size(); ++j) c.add(g.errors[j], j < g.reasons.size() ? g.reasons[j] : "");
  }
  for (const auto& [name, c] : per_env)
    TROUPE_TRY(check_failure_bound(s, name, c, "step " + std::to_string(step)));
  return {};
}

std::string encodable(const policy::io::Tokenizer& tok, const std::string& text) {
  if (tok.encode(text).ok()) return text;
  const bool question_ok = tok.encode("?").ok();
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
    if (i + len > text.size()) len = 1;
    std::string unit = text.substr(i, len);
    if (tok.encode(unit).ok()) out += unit;
    else if (question_ok) out += '?';
    i += len;
  }
  return out;
}

std::string encodable_messages(const policy::io::Tokenizer& tok, const std::string& messages_json) {
  nlohmann::ordered_json m = nlohmann::ordered_json::parse(messages_json, nullptr, false);
  if (!m.is_array() || m.empty()) return "";
  for (auto& x : m)
    if (x.is_object() && x.contains("content") && x["content"].is_string())
      x["content"] = encodable(tok, x["content"].get<std::string>());
  return m.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string prompt_messages_of(const RunState& s, const std::string& messages_json) {
  if (s.cfg.rollout.template_name != PromptTemplate::chat) return "";
  return encodable_messages(*s.tokenizer, messages_json);
}

}  // namespace troupe::actors::coord
