// `arithmetic`: generated integer expressions (digits x terms x ops), exact-match reward plus an
// optional format reward. At its easiest (digits 1, terms 2, ops "+", format plain) the prompt is
// "3+4=" and the reference completion "7": small enough for a tiny char-level model to learn.
#include "builtin/answer_scoring.h"
#include "builtin/int_expression.h"
#include "builtin/single_turn.h"
#include "src/config_util.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/expr.h"
#include "troupe/envs/tools.h"

namespace troupe::envs {

namespace {

class ArithmeticEnv final : public detail::SingleTurnEnv {
 public:
  detail::IntExpression shape;  // digits 1, terms 2, ops "+"
  int eval_permille = 200;
  std::string format = "plain";
  double format_reward = 0;

  EnvInfo info() const override { return {"arithmetic", "1", false, 1, {}}; }

  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    TROUPE_ASSIGN_OR_RETURN(std::string answer, detail::reference_answer(metadata, "arithmetic"));
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
    return detail::answer_score(given == answer, well_formed, format_reward);
  }

 protected:
  Result<Observation> make_instance(uint64_t seed, const ResetOptions& options) override {
    TROUPE_ASSIGN_OR_RETURN(detail::DrawnExpression drawn,
                            shape.draw_in(seed, options.split, eval_permille, "arithmetic"));
    const std::string& expr = drawn.text;
    const std::string& answer = drawn.answer;
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
  TROUPE_TRY(env->shape.read(r, 1, "+"));
  TROUPE_ASSIGN_OR_RETURN(env->format, r.string("format", "plain"));
  TROUPE_ASSIGN_OR_RETURN(env->format_reward, r.number("format_reward", 0.0, 0.0, 1.0));
  TROUPE_ASSIGN_OR_RETURN(double eval_fraction, r.number("eval_fraction", 0.2, 0.0, 1.0));
  TROUPE_TRY(r.finish());
  TROUPE_TRY(env->shape.check(r.where()));
  if (env->format != "plain" && env->format != "answer_tags")
    return invalid_input("env arithmetic: 'format' must be plain or answer_tags (got '" + env->format + "')");
  env->eval_permille = static_cast<int>(eval_fraction * 1000 + 0.5);
  return std::unique_ptr<Env>(std::move(env));
}

std::string extract_answer(const std::string& completion) {
  if (auto tag = extract_last_tag(completion, "answer")) return *tag;
  std::string first = completion.substr(0, completion.find('\n'));
  return trim(first);
}

}  // namespace troupe::envs
