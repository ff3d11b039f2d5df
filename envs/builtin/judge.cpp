// The dataset env's LLM judge (judge.h): its config, the rubric, the reply's score, and the
// chat-completions call (cpp-httplib, http and https). Invariant: every failure of a call is an
// error led by its reason (judge_http, judge_timeout, judge_parse), never a silent 0.
#include "builtin/judge.h"
#include "troupe/envs/local_model.h"

#include <httplib.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "src/bounded_http.h"
#include "src/config_util.h"
#include "troupe/base/clock.h"
#include "troupe/envs/trajectory.h"

namespace troupe::envs::detail {

namespace {

constexpr const char* kDefaultRubric =
    "Grade the response to the prompt below.\n\nPrompt:\n{prompt}\n\nReference answer:\n{reference}\n\n"
    "Response:\n{response}\n\nRate the response from 0 (wrong or useless) to 10 (correct and complete). "
    "End your reply with a line 'Score: N'.";
// The largest judge answer read (a chat completion of judge.max_tokens is a few KiB); past it the
// call fails as judge_http without reading the rest.
constexpr size_t kJudgeMaxReplyBytes = size_t{16} << 20;
constexpr const char* kDefaultPattern = R"(Score:\s*(-?[0-9]+(?:\.[0-9]+)?))";

Error judge_error(Termination reason, const std::string& message) {
  return invalid_input(std::string(termination_name(reason)) + ": " + message);
}

std::string number_text(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

std::string clip(const std::string& s, size_t n = 200) { return s.size() > n ? s.substr(0, n) + "..." : s; }

// The whole of `text` (spaces around allowed) as a finite number.
bool to_number(std::string text, double* out) {
  const auto b = text.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return false;
  text = text.substr(b, text.find_last_not_of(" \t\r\n") - b + 1);
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(x)) return false;
  *out = x;
  return true;
}

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// `range: [lo, hi]`, two numbers with lo < hi.
Status read_range(ConfigReader& r, JudgeConfig& c) {
  const json* v = r.raw("range");
  if (!v) return {};
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number())
    return invalid_input(r.where() + ": 'range' must be [lo, hi], two numbers (got " + v->dump() + ")");
  c.lo = (*v)[0].get<double>();
  c.hi = (*v)[1].get<double>();
  if (!(c.lo < c.hi)) return invalid_input(r.where() + ": 'range' needs lo < hi (got " + v->dump() + ")");
  return {};
}

// `url`: an http:// or https:// base URL, split into its origin and path; without it `model` is a
// local model (a path) that the run's scorers serve.
Status check_url(const std::string& where, const std::string& url, const std::string& model) {
  if (url.empty()) {
    if (model.empty())
      return invalid_input(where + ": 'url' (an OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1) or "
                                   "'model' (a local model path, served by the run's scorers) is required");
    return {};
  }
  if (!url.starts_with("http://") && !url.starts_with("https://"))
    return invalid_input(where + ": 'url' must be an http:// or https:// base URL of an OpenAI-compatible endpoint "
                                 "(got '" + url + "'; for a local model give its path as 'model' without 'url': "
                                 "the run's scorers serve it)");
  return {};
}

}  // namespace

Result<std::string> render_rubric(const std::string& rubric, const std::string& prompt, const std::string& response,
                                  const std::string& reference) {
  std::string out;
  for (size_t i = 0; i < rubric.size();) {
    if (rubric.compare(i, 2, "{{") == 0 || rubric.compare(i, 2, "}}") == 0) {
      out += rubric[i];
      i += 2;
      continue;
    }
    if (rubric[i] == '{') {
      const size_t close = rubric.find('}', i);
      const std::string name = close == std::string::npos ? "" : rubric.substr(i + 1, close - i - 1);
      if (is_identifier(name)) {
        if (name == "prompt") out += prompt;
        else if (name == "response") out += response;
        else if (name == "reference") out += reference;
        else return invalid_input("unknown placeholder {" + name + "} (known: {prompt}, {response}, {reference}; "
                                  "write {{ and }} for literal braces)");
        i = close + 1;
        continue;
      }
    }
    out += rubric[i++];
  }
  return out;
}

Result<JudgeConfig> read_judge_config(const json& judge, const std::string& where_env) {
  const std::string where = where_env + ": judge";
  if (!judge.is_object()) return invalid_input(where + " must be a mapping (url, model, rubric, ...)");
  ConfigReader r(judge, where);
  JudgeConfig c;
  TROUPE_ASSIGN_OR_RETURN(c.url, r.string("url", ""));
  TROUPE_ASSIGN_OR_RETURN(c.model, r.string("model", ""));
  TROUPE_ASSIGN_OR_RETURN(c.api_key_env, r.string("api_key_env", ""));
  TROUPE_ASSIGN_OR_RETURN(c.rubric, r.string("rubric", kDefaultRubric));
  TROUPE_ASSIGN_OR_RETURN(std::string parse, r.string("parse", "regex"));
  TROUPE_ASSIGN_OR_RETURN(c.pattern, r.string("pattern", ""));
  TROUPE_ASSIGN_OR_RETURN(c.field, r.string("field", ""));
  TROUPE_TRY(read_range(r, c));
  TROUPE_ASSIGN_OR_RETURN(c.timeout_s, r.number("timeout_s", 60.0, 0.001, 86400.0));
  TROUPE_ASSIGN_OR_RETURN(int64_t max_tokens, r.integer("max_tokens", 256, 1, 1 << 20));
  c.max_tokens = static_cast<int>(max_tokens);
  TROUPE_ASSIGN_OR_RETURN(c.temperature, r.number("temperature", 0.0, 0.0, 2.0));
  TROUPE_TRY(r.finish());
  TROUPE_TRY(check_url(where, c.url, c.model));
  if (c.model.empty()) return invalid_input(where + ": 'model' is required (the model name the endpoint serves)");
  if (c.url.empty() && !c.api_key_env.empty())
    return invalid_input(where + ": 'url' is required with 'api_key_env' (an OpenAI-compatible base URL, e.g. "
                                 "http://127.0.0.1:8000/v1); a local model (model: PATH without url) takes no key");
  if (auto rendered = render_rubric(c.rubric, "", "", ""); !rendered.ok())
    return invalid_input(where + ": 'rubric': " + rendered.error().message);
  if (parse == "regex") {
    c.parse = JudgeParse::regex;
    if (!c.field.empty()) return invalid_input(where + ": 'field' is for parse: json (got parse: regex)");
    if (c.pattern.empty()) c.pattern = kDefaultPattern;
    try {
      if (std::regex(c.pattern, std::regex::ECMAScript).mark_count() < 1)
        return invalid_input(where + ": 'pattern' needs a capture group (the score), got '" + c.pattern + "'");
    } catch (const std::regex_error& e) {
      return invalid_input(where + ": 'pattern' is not a valid regex ('" + c.pattern + "': " + e.what() + ")");
    }
  } else if (parse == "json") {
    c.parse = JudgeParse::json;
    if (!c.pattern.empty()) return invalid_input(where + ": 'pattern' is for parse: regex (got parse: json)");
    if (c.field.empty()) return invalid_input(where + ": parse: json needs 'field' (the reply's field holding the score)");
  } else {
    return invalid_input(where + ": 'parse' must be regex or json (got '" + parse + "')");
  }
  if (!c.api_key_env.empty()) {
    const char* key = std::getenv(c.api_key_env.c_str());
    if (!key || !*key)
      return invalid_input(where + ": 'api_key_env' names $" + c.api_key_env + ", which is not set (or empty)");
    c.api_key = key;
  }
  return c;
}

Result<double> parse_judge_reply(const JudgeConfig& c, const std::string& content) {
  double x = 0;
  if (c.parse == JudgeParse::regex) {
    const std::regex re(c.pattern, std::regex::ECMAScript);
    std::string group;
    bool found = false;
    for (auto it = std::sregex_iterator(content.begin(), content.end(), re); it != std::sregex_iterator(); ++it) {
      group = (*it)[1].str();  // the last match's first group
      found = true;
    }
    if (!found) return judge_error(Termination::judge_parse, "pattern '" + c.pattern + "' does not match the reply '" + clip(content) + "'");
    if (!to_number(group, &x))
      return judge_error(Termination::judge_parse, "the pattern's group '" + clip(group) + "' is not a number (reply '" + clip(content) + "')");
  } else {
    json j = json::parse(content, nullptr, false);
    if (!j.is_object()) {  // a JSON object inside other text (e.g. a fenced block)
      const size_t b = content.find('{'), e = content.rfind('}');
      if (b != std::string::npos && e != std::string::npos && e > b) j = json::parse(content.substr(b, e - b + 1), nullptr, false);
    }
    if (!j.is_object()) return judge_error(Termination::judge_parse, "the reply is not a JSON object: '" + clip(content) + "'");
    auto it = j.find(c.field);
    if (it == j.end()) return judge_error(Termination::judge_parse, "the reply has no field '" + c.field + "': '" + clip(content) + "'");
    if (it->is_number()) x = it->get<double>();
    else if (!(it->is_string() && to_number(it->get<std::string>(), &x)))
      return judge_error(Termination::judge_parse, "the reply's field '" + c.field + "' is not a number: " + clip(it->dump()));
    if (!std::isfinite(x)) return judge_error(Termination::judge_parse, "the reply's field '" + c.field + "' is not finite");
  }
  if (x < c.lo || x > c.hi)
    return judge_error(Termination::judge_parse, "score " + number_text(x) + " is outside range [" + number_text(c.lo) +
                                                      ", " + number_text(c.hi) + "]");
  return (x - c.lo) / (c.hi - c.lo);
}

Judge::Judge(JudgeConfig config) : config_(std::move(config)) {
  const size_t scheme = config_.url.find("://");
  const size_t slash = config_.url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  origin_ = slash == std::string::npos ? config_.url : config_.url.substr(0, slash);
  path_ = slash == std::string::npos ? "" : config_.url.substr(slash);
  while (!path_.empty() && path_.back() == '/') path_.pop_back();
  path_ += "/chat/completions";
}

// A local model (model: PATH, no url): the rubric as the prompt of a scorer's generation
// (local_model.h); a failed call is judge_timeout (its deadline passed) or judge_http (anything else).
Result<JudgeScore> Judge::score_local(const std::string& message) const {
  const auto t0 = MonoClock::now();
  auto text = call_local_model(LocalModelRequest{config_.model, message, config_.max_tokens, config_.temperature,
                                                 config_.timeout_s});
  JudgeScore out;
  out.latency_s = seconds_since(t0);
  const std::string where = "judge model " + config_.model;
  if (!text.ok())
    return judge_error(text.error().code == ErrorCode::timeout || text.error().message.find("timed out") != std::string::npos
                           ? Termination::judge_timeout
                           : Termination::judge_http,
                       where + ": " + text.error().message);
  auto s = parse_judge_reply(config_, *text);
  if (!s.ok()) return Error{s.error().code, s.error().message + " (" + where + ")"};
  out.score = *s;
  return out;
}

Result<JudgeScore> Judge::score(const std::string& prompt, const std::string& response, const std::string& reference) const {
  TROUPE_ASSIGN_OR_RETURN(const std::string message, render_rubric(config_.rubric, prompt, response, reference));
  if (config_.url.empty()) return score_local(message);
  const json body = {{"model", config_.model},
                     {"messages", json::array({{{"role", "user"}, {"content", message}}})},
                     {"max_tokens", config_.max_tokens},
                     {"temperature", config_.temperature}};
  const std::string where = "judge POST " + origin_ + path_;
  httplib::Client client(origin_);
  const auto secs = static_cast<time_t>(config_.timeout_s);
  const auto usecs = static_cast<time_t>((config_.timeout_s - static_cast<double>(secs)) * 1e6);
  client.set_connection_timeout(secs, usecs);
  client.set_read_timeout(secs, usecs);
  client.set_write_timeout(secs, usecs);
  httplib::Headers headers;
  if (!config_.api_key.empty()) headers.emplace("Authorization", "Bearer " + config_.api_key);
  const auto r = bounded_post(client, path_, headers, body.dump(-1, ' ', false, json::error_handler_t::replace),
                              kJudgeMaxReplyBytes, config_.timeout_s);
  JudgeScore out;
  out.latency_s = r.seconds;
  if (r.too_large)
    return judge_error(Termination::judge_http, where + ": the answer is larger than " +
                                                    std::to_string(kJudgeMaxReplyBytes >> 20) + " MiB (not read further)");
  if (!r.ok) {
    const auto e = r.error;
    if (r.past_deadline || e == httplib::Error::ConnectionTimeout ||
        (e == httplib::Error::Read && out.latency_s >= 0.9 * config_.timeout_s))
      return judge_error(Termination::judge_timeout, where + ": no answer within judge.timeout_s " + number_text(config_.timeout_s) + " s");
    return judge_error(Termination::judge_http, where + ": " + httplib::to_string(e));
  }
  if (r.status < 200 || r.status >= 300)
    return judge_error(Termination::judge_http, where + ": HTTP " + std::to_string(r.status) + ": " + clip(r.body, 400));
  const json reply = json::parse(r.body, nullptr, false);
  const json* content = nullptr;
  if (reply.is_object() && reply.contains("choices") && reply["choices"].is_array() && !reply["choices"].empty()) {
    const json& choice = reply["choices"][0];
    if (choice.is_object() && choice.contains("message") && choice["message"].is_object() &&
        choice["message"].contains("content") && choice["message"]["content"].is_string())
      content = &choice["message"]["content"];
  }
  if (!content)
    return judge_error(Termination::judge_parse, where + ": the answer has no choices[0].message.content: " + clip(r.body));
  auto s = parse_judge_reply(config_, content->get<std::string>());
  if (!s.ok()) return Error{s.error().code, s.error().message + " (model " + config_.model + ")"};
  out.score = *s;
  return out;
}

}  // namespace troupe::envs::detail
