// `calculator`: a tool-use env. The model must call the calculator tool
//   <tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>
// read the <tool_result>, then answer in <answer></answer>. Reward 1 for the right answer after at
// least one tool call (require_tool), format_reward for a wrong or tool-less answer, 0 otherwise.
#include "builtin/answer_scoring.h"
#include "builtin/int_expression.h"
#include "src/config_util.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/expr.h"
#include "troupe/envs/tools.h"

namespace troupe::envs {

namespace {

ToolSpec calculator_tool() {
  return {"calculator", "Evaluates an arithmetic expression over integers with + - * / and parentheses, exactly.",
          {{"type", "object"},
           {"properties", {{"expression", {{"type", "string"}, {"description", "e.g. (12+3)*4"}}}}},
           {"required", {"expression"}}}};
}

void run_calculator(ToolCall& call) {
  if (!call.ok) return;
  if (call.name != "calculator") {
    call.ok = false;
    call.result = "unknown tool '" + call.name + "' (available: calculator)";
    return;
  }
  auto it = call.arguments.find("expression");
  if (it == call.arguments.end() || !it->is_string()) {
    call.ok = false;
    call.result = "calculator needs a string argument 'expression'";
    return;
  }
  auto v = eval_expression(it->get<std::string>());
  call.ok = v.ok();
  call.result = v.ok() ? v->value.to_string() : v.error().message;
}

class CalculatorEnv final : public Env {
 public:
  detail::IntExpression shape{3, 2, "+-*", true};
  int max_turns = 4, eval_permille = 200;
  bool require_tool = true;
  double format_reward = 0.1;

  EnvInfo info() const override { return {"calculator", "1", true, max_turns, {calculator_tool()}}; }

  Result<Observation> reset(uint64_t seed, const ResetOptions& options) override {
    TROUPE_ASSIGN_OR_RETURN(detail::DrawnExpression drawn,
                            shape.draw_in(seed, options.split, eval_permille, "calculator"));
    const std::string& expr = drawn.text;
    answer_ = drawn.answer;
    turns_ = 0;
    tool_calls_ = 0;
    active_ = true;
    Observation o;
    o.text = "Compute " + expr + ". Call the calculator tool as <tool_call>{\"name\": \"calculator\", \"arguments\": "
             "{\"expression\": \"...\"}}</tool_call>, then give the final answer in <answer></answer>.";
    o.messages.push_back({"user", o.text});
    json call = {{"name", "calculator"}, {"arguments", {{"expression", expr}}}};
    json turns = {"<tool_call>" + call.dump() + "</tool_call>", "<answer>" + answer_ + "</answer>"};
    o.metadata = {{"answer", answer_}, {"expression", expr}, {"reference_completion", turns[0]},
                  {"reference_turns", turns}, {"split", split_name(options.split)}};
    return o;
  }

  Result<StepResult> step(const std::string& action) override {
    if (!active_) return invalid_input("calculator: step() before reset() or after the episode ended");
    ++turns_;
    StepResult s;
    auto calls = parse_tool_calls(action);
    if (!calls.empty()) {
      json records = json::array();
      for (auto& c : calls) {
        run_calculator(c);
        ++tool_calls_;
        s.observation.text += format_tool_result(c);
        records.push_back(to_json(c));
      }
      s.observation.messages.push_back({"tool", s.observation.text});
      s.info["tool_calls"] = records;
      if (turns_ >= max_turns) {
        s.done = true;
        s.info["termination"] = "max_turns";
        active_ = false;
      }
      return s;
    }
    json meta = {{"answer", answer_}};
    TROUPE_ASSIGN_OR_RETURN(VerifyResult v, verify(meta, action));
    if (require_tool && tool_calls_ == 0 && v.reward >= 1.0) {
      v.reward = format_reward;
      v.info["reason"] = "answered without calling the calculator";
    }
    s.reward = v.reward;
    s.components = v.components;
    s.components["tool_used"] = tool_calls_ > 0 ? 1.0 : 0.0;
    s.info = v.info;
    s.info["termination"] = "done";
    s.done = true;
    active_ = false;
    return s;
  }

  // Scores a final answer alone (tool use cannot be seen here; step() enforces it).
  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    TROUPE_ASSIGN_OR_RETURN(std::string answer, detail::reference_answer(metadata, "calculator"));
    auto tag = extract_last_tag(completion, "answer");
    return detail::answer_score(tag && verify_numeric(*tag, answer), tag.has_value(), format_reward);
  }

  void release() override { active_ = false; }

 private:
  std::string answer_;
  int turns_ = 0, tool_calls_ = 0;
  bool active_ = false;
};

}  // namespace

Result<std::unique_ptr<Env>> make_calculator_env(const json& config) {
  detail::ConfigReader r(config, "env calculator");
  TROUPE_TRY(r.check_object());
  auto env = std::make_unique<CalculatorEnv>();
  TROUPE_TRY(env->shape.read(r, 3, "+-*"));
  TROUPE_ASSIGN_OR_RETURN(auto max_turns, r.integer("max_turns", 4, 2, 100));
  TROUPE_ASSIGN_OR_RETURN(env->require_tool, r.boolean("require_tool", true));
  TROUPE_ASSIGN_OR_RETURN(env->format_reward, r.number("format_reward", 0.1, 0.0, 1.0));
  TROUPE_ASSIGN_OR_RETURN(env->eval_permille, r.eval_permille());
  TROUPE_TRY(r.finish());
  TROUPE_TRY(env->shape.check(r.where()));
  env->max_turns = static_cast<int>(max_turns);
  return std::unique_ptr<Env>(std::move(env));
}

}  // namespace troupe::envs
