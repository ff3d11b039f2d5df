// Private: the dataset env's LLM judge (`config.judge`), a model behind an OpenAI-compatible
// endpoint that scores each completion by a rubric. Invariants: a config that reads is complete
// (url, model, a rubric with known placeholders, a parse rule, lo < hi); a score is in [0, 1] or
// the call fails with its reason (judge_http, judge_timeout, judge_parse) leading its message.
#pragma once

#include <memory>
#include <regex>
#include <string>

#include "troupe/envs/env.h"

namespace troupe::envs::detail {

enum class JudgeParse { regex, json };

struct JudgeConfig {
  std::string url;          // the endpoint's base URL (http[s]://host:port[/path]), e.g. http://127.0.0.1:8000/v1
  std::string model;        // the model name sent; without url: a local model's path, served by the run's scorers
  std::string api_key_env;  // the environment variable holding the key ("" = no Authorization header)
  std::string api_key;      // its value, read when the config is read
  std::string rubric;       // the user message: {prompt}, {response}, {reference}; {{ and }} are literal braces
  JudgeParse parse = JudgeParse::regex;
  std::string pattern;      // regex: its first capture group is the score
  std::string field;        // json: the reply's field holding the score
  double lo = 0, hi = 10;   // range: lo -> 0, hi -> 1
  double timeout_s = 60;    // one call's deadline
  int max_tokens = 256;
  double temperature = 0;
};

// Reads `config.judge` (a mapping); every error names the key ("env dataset: judge.url ...").
Result<JudgeConfig> read_judge_config(const json& judge, const std::string& where);

// The rubric with its placeholders filled; an unknown placeholder is an invalid_input error naming it.
Result<std::string> render_rubric(const std::string& rubric, const std::string& prompt, const std::string& response,
                                  const std::string& reference);

// The score in a reply's text mapped onto [0, 1]; an error "judge_parse: ..." naming what was wrong.
Result<double> parse_judge_reply(const JudgeConfig& config, const std::string& content);

struct JudgeScore {
  double score = 0;      // in [0, 1]
  double latency_s = 0;  // the HTTP call's seconds
};

class Judge {
 public:
  explicit Judge(JudgeConfig config);
  // One chat-completions call; a failure is an invalid_input error whose message starts with its
  // reason: judge_http (no connection, a non-2xx answer), judge_timeout, judge_parse.
  Result<JudgeScore> score(const std::string& prompt, const std::string& response, const std::string& reference) const;
  const JudgeConfig& config() const { return config_; }

 private:
  Result<JudgeScore> score_local(const std::string& message) const;
  JudgeConfig config_;
  std::string origin_;  // scheme://host:port
  std::string path_;    // the base URL's path, then /chat/completions
};

}  // namespace troupe::envs::detail
