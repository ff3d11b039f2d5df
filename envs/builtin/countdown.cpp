// `countdown` (TinyZero's task): reach the target from the given numbers with + - * /, each used
// exactly once (use_all) or at most once. Scored by countdown_score with exact rationals, no eval.
#include <algorithm>

#include "builtin/answer_scoring.h"
#include "builtin/single_turn.h"
#include "src/config_util.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/expr.h"
#include "troupe/envs/tools.h"

namespace troupe::envs {

VerifyResult countdown_score(const std::string& completion, const std::vector<int64_t>& numbers, int64_t target,
                             bool use_all, double format_reward) {
  VerifyResult v;
  v.components["correct"] = 0;
  v.components["format"] = 0;
  auto eq = extract_last_tag(completion, "answer");
  if (!eq) {
    v.info["reason"] = "no <answer></answer>";
    return v;
  }
  v.components["format"] = 1;
  v.reward = format_reward;
  std::string text = *eq;
  if (auto p = text.find('='); p != std::string::npos) text = text.substr(0, p);  // "1+2 = 3" -> "1+2"
  auto value = eval_expression(text);
  if (!value.ok()) {
    v.info["reason"] = value.error().message;
    return v;
  }
  std::vector<int64_t> used = value->literals, avail = numbers;
  std::sort(used.begin(), used.end());
  std::sort(avail.begin(), avail.end());
  bool numbers_ok = use_all ? used == avail : std::includes(avail.begin(), avail.end(), used.begin(), used.end());
  if (!numbers_ok) {
    v.info["reason"] = use_all ? "must use each number exactly once" : "uses a number not given or more than once";
    return v;
  }
  if (!(value->value == Rational{target, 1})) {
    v.info["reason"] = "equation equals " + value->value.to_string() + ", not " + std::to_string(target);
    return v;
  }
  v.components["correct"] = 1;
  v.reward = 1.0;
  return v;
}

Result<VerifyResult> detail::countdown_score_of(const json& metadata, const std::string& completion,
                                                bool use_all, double format_reward, const std::string& env) {
  auto n = metadata.find("numbers");
  auto t = metadata.find("target");
  if (n == metadata.end() || !n->is_array() || t == metadata.end() || !t->is_number_integer())
    return invalid_input(env +
                         ": verify metadata needs 'numbers' (array of integers) and 'target' (integer)");
  std::vector<int64_t> numbers;
  for (const auto& x : *n) {
    if (!x.is_number_integer()) return invalid_input(env + ": 'numbers' must hold integers");
    numbers.push_back(x.get<int64_t>());
  }
  return countdown_score(completion, numbers, t->get<int64_t>(), use_all, format_reward);
}

namespace {

class CountdownEnv final : public detail::SingleTurnEnv {
 public:
  int num_numbers = 3, eval_permille = 200;
  int64_t min_number = 1, max_number = 99, max_target = 100;
  bool use_all = true;
  double format_reward = 0.1;

  EnvInfo info() const override { return {"countdown", "1", false, 1, {}}; }

  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    return detail::countdown_score_of(metadata, completion, use_all, format_reward, "countdown");
  }

 protected:
  Result<Observation> make_instance(uint64_t seed, const ResetOptions& options) override {
    std::vector<int64_t> numbers;
    int64_t target = 0;
    std::string solution;
    TROUPE_TRY(detail::draw_in_split(seed, options.split, eval_permille, "countdown", [&](detail::SplitMix& rng) {
      solution.clear();
      for (int attempt = 0; attempt < 1000; ++attempt) {
        numbers.clear();
        for (int i = 0; i < num_numbers; ++i) numbers.push_back(rng.uniform(min_number, max_number));
        // A random left-to-right expression over a random order of (all or some of) the numbers.
        std::vector<int64_t> order = numbers;
        for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(i) - 1))]);
        size_t count = use_all ? order.size() : static_cast<size_t>(rng.uniform(2, static_cast<int64_t>(order.size())));
        std::string expr = std::to_string(order[0]);
        for (size_t i = 1; i < count; ++i) {
          static const char kOps[] = {'+', '-', '*', '/'};
          expr = (i > 1 ? "(" + expr + ")" : expr) + " " + kOps[rng.uniform(0, 3)] + " " + std::to_string(order[i]);
        }
        auto value = eval_expression(expr);
        if (!value.ok() || !value->value.is_integer() || value->value.num < 1 || value->value.num > max_target) continue;
        target = value->value.num;
        solution = expr;
        break;
      }
      std::vector<int64_t> sorted = numbers;
      std::sort(sorted.begin(), sorted.end());
      std::string canonical;
      for (auto x : sorted) canonical += std::to_string(x) + ",";
      return canonical + "=" + std::to_string(target);
    }));
    if (solution.empty()) return invalid_input("countdown: could not generate a solvable instance; widen max_target");
    std::string list;
    for (size_t i = 0; i < numbers.size(); ++i) list += (i ? ", " : "") + std::to_string(numbers[i]);
    std::string prompt = "Using the numbers [" + list + "], create an equation that equals " + std::to_string(target) +
                         ". You can use basic arithmetic operations (+, -, *, /) and each number can only be used " +
                         (use_all ? "once, and must use every number" : "once") +
                         ". Show your work in <think> </think> tags. And return the final answer in <answer> </answer> "
                         "tags, for example <answer> (1 + 2) / 3 </answer>.";
    return detail::text_observation(prompt, {{"numbers", numbers}, {"target", target}, {"answer", std::to_string(target)},
                                             {"reference_completion", "<answer>" + solution + "</answer>"},
                                             {"split", split_name(options.split)}});
  }
};

}  // namespace

Result<std::unique_ptr<Env>> make_countdown_env(const json& config) {
  detail::ConfigReader r(config, "env countdown");
  TROUPE_TRY(r.check_object());
  auto env = std::make_unique<CountdownEnv>();
  TROUPE_ASSIGN_OR_RETURN(auto n, r.integer("num_numbers", 3, 2, 6));
  TROUPE_ASSIGN_OR_RETURN(env->min_number, r.integer("min_number", 1, 0, 1000000));
  TROUPE_ASSIGN_OR_RETURN(env->max_number, r.integer("max_number", 99, 1, 1000000));
  TROUPE_ASSIGN_OR_RETURN(env->max_target, r.integer("max_target", 100, 1, 1000000000));
  TROUPE_ASSIGN_OR_RETURN(env->use_all, r.boolean("use_all", true));
  TROUPE_ASSIGN_OR_RETURN(env->format_reward, r.number("format_reward", 0.1, 0.0, 1.0));
  TROUPE_ASSIGN_OR_RETURN(env->eval_permille, r.eval_permille());
  TROUPE_TRY(r.finish());
  if (env->min_number > env->max_number) return invalid_input("env countdown: min_number > max_number");
  env->num_numbers = static_cast<int>(n);
  return std::unique_ptr<Env>(std::move(env));
}

}  // namespace troupe::envs
