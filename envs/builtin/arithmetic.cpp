// `arithmetic`: generated integer expressions (digits x terms x ops), exact-match reward plus an
// optional format reward. At its easiest (digits 1, terms 2, ops "+", format plain) the prompt is
// "3+4=" and the reference completion "7": small enough for a tiny char-level model to learn.
// Format `question` asks in words ("What is 23 + 42?") and scores the last number of the reply,
// the form a chat model answers in ("23 + 42 = 65").
#include <cctype>

#include "builtin/answer_scoring.h"
#include "builtin/int_expression.h"
#include "builtin/single_turn.h"
#include "src/config_util.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/expr.h"
#include "troupe/envs/tools.h"

namespace troupe::envs {

namespace {

// "12+7*3" -> "12 + 7 * 3".
std::string spaced_operators(const std::string& expr) {
  std::string out;
  for (char c : expr) {
    if (c == '+' || c == '-' || c == '*') {
      out += ' ';
      out += c;
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

// The last integer written in `text` ("23 + 42 = 65." -> "65", "-7" -> "-7"; thousands separators
// such as "1,234" are read as one number); empty when there is none.
std::string last_integer(const std::string& text) {
  std::string last;
  for (size_t i = 0; i < text.size();) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    const bool negative = i > 0 && text[i - 1] == '-' &&
                          (i < 2 || !std::isdigit(static_cast<unsigned char>(text[i - 2])));
    std::string digits;
    while (i < text.size()) {
      const char c = text[i];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        digits += c;
        ++i;
      } else if (c == ',' && i + 3 < text.size() &&
                 std::isdigit(static_cast<unsigned char>(text[i + 1])) &&
                 std::isdigit(static_cast<unsigned char>(text[i + 2])) &&
                 std::isdigit(static_cast<unsigned char>(text[i + 3])) &&
                 (i + 4 >= text.size() || !std::isdigit(static_cast<unsigned char>(text[i + 4])))) {
        ++i;  // a thousands separator
      } else {
        break;
      }
    }
    while (digits.size() > 1 && digits[0] == '0') digits.erase(0, 1);
    last = (negative && digits != "0" ? "-" : "") + digits;
  }
  return last;
}

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
    } else if (format == "question") {
      given = last_integer(completion);
      well_formed = !given.empty();
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
    } else if (format == "question") {
      const std::string spaced = spaced_operators(expr);
      prompt = "What is " + spaced + "?";
      reference = spaced + " = " + answer;
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
  TROUPE_ASSIGN_OR_RETURN(env->eval_permille, r.eval_permille());
  TROUPE_TRY(r.finish());
  TROUPE_TRY(env->shape.check(r.where()));
  if (env->format != "plain" && env->format != "answer_tags" && env->format != "question")
    return invalid_input("env arithmetic: 'format' must be plain, answer_tags or question (got '" + env->format +
                         "')");
  return std::unique_ptr<Env>(std::move(env));
}

std::string extract_answer(const std::string& completion) {
  if (auto tag = extract_last_tag(completion, "answer")) return *tag;
  std::string first = completion.substr(0, completion.find('\n'));
  return trim(first);
}

}  // namespace troupe::envs
