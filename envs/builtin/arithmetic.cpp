// `arithmetic`: generated integer expressions (digits x terms x ops), exact-match reward plus an
// optional format reward. At its easiest (digits 1, terms 2, ops "+", format plain) the prompt is
// "3+4=" and the reference completion "7": small enough for a tiny char-level model to learn.
#include "builtin/single_turn.h"
#include "src/config_util.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/expr.h"
#include "troupe/envs/tools.h"

namespace troupe::envs {

namespace {

class ArithmeticEnv final : public detail::SingleTurnEnv {
 public:
  int digits = 1, terms = 2, eval_permille = 200;
  std::string ops = "+", format = "plain";
  double format_reward = 0;

  EnvInfo info() const override { return {"arithmetic", "1", false, 1, {}}; }

  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    if (!metadata.contains("answer") || !metadata["answer"].is_string())
      return invalid_input("arithmetic: verify metadata has no string 'answer'");
    const std::string answer = metadata["answer"].get<std::string>();
    VerifyResult v;
    std::string given;
    bool well_formed = false;
    if (format == "answer_tags") {
      auto tag = extract_last_tag(completion, "answer");
      well_formed = tag.has_value();
      given = tag.value_or("");
    } else {
      given = extract_answer(completion);
      well_formed = !given.empty() && parse_number(given).ok();
    }
    bool correct = given == answer;
    v.components["correct"] = correct ? 1.0 : 0.0;
    v.components["format"] = well_formed ? 1.0 : 0.0;
    v.reward = correct ? 1.0 : (well_formed ? format_reward : 0.0);
    return v;
  }

 protected:
  Result<Observation> make_instance(uint64_t seed, const ResetOptions& options) override {
    std::string expr;
    int64_t hi = 1;
    for (int i = 0; i < digits; ++i) hi *= 10;
    TROUPE_TRY(detail::draw_in_split(seed, options.split, eval_permille, "arithmetic", [&](detail::SplitMix& rng) {
      expr.clear();
      for (int t = 0; t < terms; ++t) {
        if (t > 0) expr += ops[static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(ops.size()) - 1))];
        expr += std::to_string(rng.uniform(0, hi - 1));
      }
      return expr;
    }));
    TROUPE_ASSIGN_OR_RETURN(ExprValue value, eval_expression(expr));
    std::string answer = value.value.to_string();
    std::string prompt, reference;
    if (format == "answer_tags") {
      prompt = "What is " + expr + "? Put the result in <answer></answer>.\n";
      reference = "<answer>" + answer + "</answer>";
    } else {
      prompt = expr + "=";
      reference = answer;
    }
    return detail::text_observation(prompt, {{"answer", answer}, {"reference_completion", reference},
                                             {"expression", expr}, {"split", split_name(options.split)}});
  }
};

}  // namespace

Result<std::unique_ptr<Env>> make_arithmetic_env(const json& config) {
  detail::ConfigReader r(config, "env arithmetic");
  TROUPE_TRY(r.check_object());
  auto env = std::make_unique<ArithmeticEnv>();
  TROUPE_ASSIGN_OR_RETURN(auto digits, r.integer("digits", 1, 1, 9));
  TROUPE_ASSIGN_OR_RETURN(auto terms, r.integer("terms", 2, 1, 8));
  TROUPE_ASSIGN_OR_RETURN(env->ops, r.string("ops", "+"));
  TROUPE_ASSIGN_OR_RETURN(env->format, r.string("format", "plain"));
  TROUPE_ASSIGN_OR_RETURN(env->format_reward, r.number("format_reward", 0.0, 0.0, 1.0));
  TROUPE_ASSIGN_OR_RETURN(double eval_fraction, r.number("eval_fraction", 0.2, 0.0, 1.0));
  TROUPE_TRY(r.finish());
  if (env->ops.empty() || env->ops.find_first_not_of("+-*") != std::string::npos)
    return invalid_input("env arithmetic: 'ops' must be a non-empty string of + - * (got '" + env->ops + "')");
  if (env->format != "plain" && env->format != "answer_tags")
    return invalid_input("env arithmetic: 'format' must be plain or answer_tags (got '" + env->format + "')");
  env->digits = static_cast<int>(digits);
  env->terms = static_cast<int>(terms);
  env->eval_permille = static_cast<int>(eval_fraction * 1000 + 0.5);
  return std::unique_ptr<Env>(std::move(env));
}

std::string extract_answer(const std::string& completion) {
  if (auto tag = extract_last_tag(completion, "answer")) return *tag;
  std::string first = completion.substr(0, completion.find('\n'));
  return trim(first);
}

}  // namespace troupe::envs
