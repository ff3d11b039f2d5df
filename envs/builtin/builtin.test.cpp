// envs.builtin: every built-in env's verifier, determinism, split disjointness and config errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "troupe/envs/builtin.h"
#include "troupe/envs/registry.h"
#include "troupe/envs/tools.h"

using namespace troupe::envs;

namespace {

std::unique_ptr<Env> make(const std::string& name, const json& cfg = json::object()) {
  auto env = EnvRegistry::global().create(name, cfg);
  EXPECT_TRUE(env.ok()) << (env.ok() ? "" : env.error().message);
  return std::move(env).value();
}

ResetOptions eval_split() {
  ResetOptions o;
  o.split = Split::eval;
  return o;
}

// Instances (prompt + hidden answer) of the first n seeds of a split.
std::set<std::string> prompts(Env& env, Split split, int n) {
  std::set<std::string> out;
  ResetOptions o;
  o.split = split;
  for (int s = 0; s < n; ++s) {
    auto obs = env.reset(static_cast<uint64_t>(s), o);
    out.insert(obs->text + "|" + obs->metadata.value("answer", std::string()));
  }
  return out;
}

void expect_disjoint(Env& env, int n) {
  auto train = prompts(env, Split::train, n), eval = prompts(env, Split::eval, n);
  EXPECT_GT(eval.size(), 1u);
  for (const auto& p : eval) EXPECT_EQ(train.count(p), 0u) << env.info().name << " eval prompt in train: " << p;
}

std::string temp_file(const std::string& name, const std::string& body) {
  auto p = std::filesystem::temp_directory_path() / ("troupe_envs_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << body;
  return p.string();
}

}  // namespace

TEST(Registry, KnowsBuiltinsAndRejectsUnknown) {
  auto names = EnvRegistry::global().names();
  for (const char* n : {"arithmetic", "countdown", "dataset", "guess_number", "calculator"})
    EXPECT_TRUE(EnvRegistry::global().contains(n)) << n;
  auto bad = EnvRegistry::global().create("no_such_env", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("arithmetic"), std::string::npos);  // lists the known ones
  EXPECT_FALSE(EnvRegistry::global().add("arithmetic", make_arithmetic_env).ok());
}

TEST(Arithmetic, EasiestConfigIsShortAndExact) {
  auto env = make("arithmetic", {{"digits", 1}, {"terms", 2}, {"ops", "+"}});
  auto obs = env->reset(3, {});
  ASSERT_TRUE(obs.ok());
  EXPECT_EQ(obs->text.back(), '=');
  EXPECT_LE(obs->text.size(), 4u);  // "a+b="
  const std::string answer = obs->metadata["answer"];
  EXPECT_EQ(obs->metadata["reference_completion"], answer);
  int a = obs->text[0] - '0', b = obs->text[2] - '0';
  EXPECT_EQ(answer, std::to_string(a + b));
  EXPECT_EQ(env->verify(obs->metadata, answer)->reward, 1.0);
  EXPECT_EQ(env->verify(obs->metadata, " " + answer + "\nmore text")->reward, 1.0);
  EXPECT_EQ(env->verify(obs->metadata, answer + "0")->reward, 0.0);
  EXPECT_EQ(env->verify(obs->metadata, "")->reward, 0.0);
  auto step = env->step(answer);
  ASSERT_TRUE(step.ok());
  EXPECT_TRUE(step->done);
  EXPECT_EQ(step->reward, 1.0);
}

TEST(Arithmetic, DeterministicAndDisjointSplits) {
  auto a = make("arithmetic"), b = make("arithmetic");
  EXPECT_EQ(a->reset(42, {})->text, b->reset(42, {})->text);
  expect_disjoint(*a, 400);  // 100 single-digit sums: every train and eval one seen
  auto hard = make("arithmetic", {{"digits", 3}, {"terms", 3}, {"ops", "+-*"}});
  expect_disjoint(*hard, 300);
  auto obs = hard->reset(7, eval_split());
  EXPECT_EQ(hard->verify(obs->metadata, obs->metadata["reference_completion"].get<std::string>())->reward, 1.0);
}

TEST(Arithmetic, FormatReward) {
  auto env = make("arithmetic", {{"format", "answer_tags"}, {"format_reward", 0.1}, {"digits", 2}});
  auto obs = env->reset(1, {});
  const std::string answer = obs->metadata["answer"];
  EXPECT_EQ(env->verify(obs->metadata, "<answer>" + answer + "</answer>")->reward, 1.0);
  EXPECT_DOUBLE_EQ(env->verify(obs->metadata, "<answer>-12345</answer>")->reward, 0.1);
  EXPECT_EQ(env->verify(obs->metadata, answer)->reward, 0.0);
}

// format question: asked in words, scored by the last integer of the reply (a chat model's form).
TEST(Arithmetic, QuestionFormatScoresTheLastNumber) {
  auto env = make("arithmetic", {{"format", "question"}, {"digits", 2}, {"ops", "+-"}});
  auto obs = env->reset(3, {});
  const std::string expr = obs->metadata["expression"], answer = obs->metadata["answer"];
  EXPECT_EQ(obs->text.rfind("What is ", 0), 0u) << obs->text;
  EXPECT_EQ(obs->text.back(), '?');
  EXPECT_EQ(env->verify(obs->metadata, obs->metadata["reference_completion"].get<std::string>())->reward, 1.0);
  EXPECT_EQ(env->verify(obs->metadata, "The answer is " + answer + ".")->reward, 1.0);
  EXPECT_EQ(env->verify(obs->metadata, answer + " is wrong, it is 100000")->reward, 0.0);
  EXPECT_EQ(env->verify(obs->metadata, "no idea")->reward, 0.0);
  EXPECT_EQ(env->verify(obs->metadata, "no idea")->components.at("format"), 0.0);
  // negatives, a minus between numbers, thousands separators, leading zeros
  const json m = [](const std::string& a) { return json{{"answer", a}}; }("-19");
  EXPECT_EQ(env->verify(m, "23 - 42 = -19")->reward, 1.0);
  EXPECT_EQ(env->verify(json{{"answer", "19"}}, "42-23=19")->reward, 1.0);
  EXPECT_EQ(env->verify(json{{"answer", "1234"}}, "so 1,234")->reward, 1.0);
  EXPECT_EQ(env->verify(json{{"answer", "7"}}, "= 007")->reward, 1.0);
  EXPECT_EQ(env->verify(json{{"answer", "12"}}, "1,2")->reward, 0.0);
}

TEST(Arithmetic, ConfigErrorsNameTheKey) {
  for (const json& cfg : {json{{"digits", 0}}, json{{"ops", "/"}}, json{{"format", "xml"}}, json{{"digitz", 2}},
                          json{{"terms", "two"}}, json("not a mapping")}) {
    auto env = EnvRegistry::global().create("arithmetic", cfg);
    ASSERT_FALSE(env.ok()) << cfg.dump();
    EXPECT_NE(env.error().message.find("arithmetic"), std::string::npos);
  }
  auto all_eval = make("arithmetic", {{"eval_fraction", 0.0}});
  EXPECT_FALSE(all_eval->reset(0, eval_split()).ok());
}

TEST(Countdown, TinyZeroScoring) {
  std::vector<int64_t> nums = {3, 5, 7};
  EXPECT_EQ(countdown_score("<think>..</think><answer>(7 - 3) * 5</answer>", nums, 20, true, 0.1).reward, 1.0);
  EXPECT_EQ(countdown_score("<answer>(7-3)*5 = 20</answer>", nums, 20, true, 0.1).reward, 1.0);
  EXPECT_DOUBLE_EQ(countdown_score("<answer>7 + 3 + 5</answer>", nums, 20, true, 0.1).reward, 0.1);   // wrong value
  EXPECT_DOUBLE_EQ(countdown_score("<answer>4 * 5</answer>", nums, 20, true, 0.1).reward, 0.1);       // numbers not given
  EXPECT_DOUBLE_EQ(countdown_score("<answer>(7-3)*5*5/5</answer>", nums, 20, true, 0.1).reward, 0.1); // reuse
  EXPECT_DOUBLE_EQ(countdown_score("<answer>import os</answer>", nums, 20, true, 0.1).reward, 0.1);   // not arithmetic
  EXPECT_DOUBLE_EQ(countdown_score("<answer>7/(5-5)</answer>", nums, 20, true, 0.1).reward, 0.1);     // div by zero
  EXPECT_EQ(countdown_score("(7 - 3) * 5", nums, 20, true, 0.1).reward, 0.0);                         // no tags
  // exactly once vs at most once
  EXPECT_DOUBLE_EQ(countdown_score("<answer>3 + 7</answer>", nums, 10, true, 0.1).reward, 0.1);
  EXPECT_EQ(countdown_score("<answer>3 + 7</answer>", nums, 10, false, 0.1).reward, 1.0);
  // exact rationals: 5 / 3 * 3 = 5 exactly
  EXPECT_EQ(countdown_score("<answer>5 / 3 * 3</answer>", {5, 3, 3}, 5, true, 0.1).reward, 1.0);
  // the last answer tag wins
  EXPECT_EQ(countdown_score("<answer>1</answer> no wait <answer>(7-3)*5</answer>", nums, 20, true, 0.1).reward, 1.0);
}

TEST(Countdown, GeneratedInstancesAreSolvableAndSplit) {
  auto env = make("countdown", {{"num_numbers", 4}});
  for (uint64_t seed = 0; seed < 30; ++seed) {
    auto obs = env->reset(seed, seed % 2 ? eval_split() : ResetOptions{});
    ASSERT_TRUE(obs.ok()) << obs.error().message;
    EXPECT_EQ(obs->metadata["numbers"].size(), 4u);
    int64_t target = obs->metadata["target"];
    EXPECT_GE(target, 1);
    EXPECT_LE(target, 100);
    const std::string ref = obs->metadata["reference_completion"];
    EXPECT_EQ(env->verify(obs->metadata, ref)->reward, 1.0) << ref << " target " << target;
  }
  expect_disjoint(*env, 200);
}

TEST(Dataset, TemplateVerifiersAndSplits) {
  auto train = temp_file("train.jsonl",
                         "{\"question\": \"What is half of one?\", \"answer\": \"0.5\"}\n"
                         "\n"
                         "{\"question\": \"Two plus two?\", \"answer\": 4, \"completion\": \"It is <answer>4</answer>\"}\n"
                         "{\"question\": \"Shared\", \"answer\": \"1\"}\n");
  auto eval = temp_file("eval.jsonl", "{\"question\": \"Three times three?\", \"answer\": \"9\"}\n"
                                      "{\"question\": \"Shared\", \"answer\": \"1\"}\n");
  auto env = make("dataset", {{"train", train}, {"eval", eval}, {"template", "Q: {question}\nA:"}, {"verifier", "numeric"}});
  std::set<std::string> seen = prompts(*env, Split::train, 10);
  EXPECT_EQ(seen.size(), 2u);  // the prompt shared with eval is dropped from train
  EXPECT_EQ(seen.count("Q: Shared\nA:|1"), 0u);
  auto obs = env->reset(0, {});
  EXPECT_EQ(obs->text, "Q: What is half of one?\nA:");
  EXPECT_EQ(env->verify(obs->metadata, "<answer>1/2</answer>")->reward, 1.0);
  EXPECT_EQ(env->verify(obs->metadata, "0.50")->reward, 1.0);
  EXPECT_EQ(env->verify(obs->metadata, "<answer>0.6</answer>")->reward, 0.0);
  auto second = env->reset(1, {});
  EXPECT_EQ(second->metadata["reference_completion"], "It is <answer>4</answer>");
  EXPECT_EQ(env->reset(0, eval_split())->text, "Q: Three times three?\nA:");

  auto exact = make("dataset", {{"train", train}, {"verifier", "exact"}, {"eval_fraction", 0.5}});
  (void)exact;
  auto rx_file = temp_file("rx.jsonl", "{\"question\": \"Name a color\", \"answer\": \"(red|blue)\"}\n");
  auto rx = EnvRegistry::global().create("dataset", {{"train", rx_file}, {"eval", rx_file + ".none"}, {"verifier", "regex"}});
  ASSERT_FALSE(rx.ok());  // the eval file does not exist
  EXPECT_NE(rx.error().message.find(rx_file + ".none"), std::string::npos);
}

// Instances built from one config share one copy of the rows while any of them lives (an env
// worker's pool does not read the file once per instance); a later config, or the same one after
// every instance is gone, reads the file again.
TEST(Dataset, InstancesOfOneConfigShareTheirRows) {
  const std::string path = temp_file("shared.jsonl", "{\"question\": \"old\", \"answer\": \"1\"}\n");
  const json config = {{"train", path}, {"eval_fraction", 0}};
  auto first = make("dataset", config);
  { std::ofstream(path) << "{\"question\": \"new\", \"answer\": \"1\"}\n"; }
  auto second = make("dataset", config);
  EXPECT_EQ(second->reset(0, {})->text, "old");  // the rows the first instance loaded
  auto other = make("dataset", {{"train", path}, {"eval_fraction", 0}, {"template", "{question}?"}});
  EXPECT_EQ(other->reset(0, {})->text, "new?");  // another config reads the file
  first.reset();
  second.reset();
  EXPECT_EQ(make("dataset", config)->reset(0, {})->text, "new");  // nothing held the rows any more
}

TEST(Dataset, RegexAndCountdownVerifiers) {
  auto rx_file = temp_file("rx2.jsonl", "{\"question\": \"Name a color\", \"answer\": \"(red|blue)\"}\n");
  auto rx = EnvRegistry::global().create("dataset", {{"train", rx_file}, {"eval", rx_file}, {"verifier", "regex"}});
  ASSERT_FALSE(rx.ok());  // every train prompt is held out
  auto rx_eval = temp_file("rx2e.jsonl", "{\"question\": \"Name a fruit\", \"answer\": \"apple|pear\"}\n");
  auto env = make("dataset", {{"train", rx_file}, {"eval", rx_eval}, {"verifier", "regex"}});
  auto obs = env->reset(0, {});
  EXPECT_EQ(env->verify(obs->metadata, "<answer>blue</answer>")->reward, 1.0);
  EXPECT_EQ(env->verify(obs->metadata, "<answer>green</answer>")->reward, 0.0);
  EXPECT_EQ(env->verify(obs->metadata, "<answer>bluegreen</answer>")->reward, 0.0);  // full match

  auto cd = temp_file("cd.jsonl", "{\"numbers\": [3, 5, 7], \"target\": 20, \"q\": \"x\"}\n");
  auto cde = temp_file("cde.jsonl", "{\"numbers\": [1, 2, 3], \"target\": 6, \"q\": \"y\"}\n");
  auto cenv = make("dataset", {{"train", cd}, {"eval", cde}, {"verifier", "countdown"}, {"template", "{numbers} -> {target}"}});
  auto cobs = cenv->reset(0, {});
  EXPECT_EQ(cobs->text, "[3,5,7] -> 20");
  EXPECT_EQ(cenv->verify(cobs->metadata, "<answer>(7-3)*5</answer>")->reward, 1.0);
  EXPECT_DOUBLE_EQ(cenv->verify(cobs->metadata, "<answer>7+3+5</answer>")->reward, 0.1);
}

TEST(Dataset, MalformedRowNamesFileAndLine) {
  struct Case {
    std::string body, json_cfg_verifier, expect;
  };
  for (const Case& c : {Case{"{\"question\": \"a\", \"answer\": \"1\"}\n{not json\n", "exact", ":2: error: not valid JSON"},
                        Case{"[1, 2]\n", "exact", ":1: error: a row must be a JSON object"},
                        Case{"{\"question\": \"a\"}\n", "exact", ":1: error: row has no answer field 'answer'"},
                        Case{"{\"prompt\": \"a\", \"answer\": \"1\"}\n", "exact", ":1: error: row has no field 'question'"},
                        Case{"{\"question\": \"a\", \"answer\": \"x\"}\n", "numeric", ":1: error: answer 'x' is not a number"},
                        Case{"{\"question\": \"a\", \"answer\": \"(\"}\n", "regex", ":1: error: answer is not a valid regex"},
                        Case{"{\"question\": \"a\", \"numbers\": [1], \"target\": \"2\"}\n", "countdown", ":1: error: countdown rows"}}) {
    auto f = temp_file("bad.jsonl", c.body);
    auto env = EnvRegistry::global().create("dataset", {{"train", f}, {"verifier", c.json_cfg_verifier}});
    ASSERT_FALSE(env.ok()) << c.body;
    EXPECT_NE(env.error().message.find(f + c.expect), std::string::npos) << env.error().message;
  }
  auto missing = EnvRegistry::global().create("dataset", {{"train", "/nonexistent/t.jsonl"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("/nonexistent/t.jsonl"), std::string::npos);
  EXPECT_FALSE(EnvRegistry::global().create("dataset", json::object()).ok());
  EXPECT_FALSE(EnvRegistry::global().create("dataset", {{"train", "x"}, {"verifier", "sympy"}}).ok());
}

TEST(GuessNumber, HintsAndRewardByTurns) {
  auto env = make("guess_number", {{"max_number", 16}, {"max_turns", 5}});
  EXPECT_TRUE(env->info().multi_turn);
  auto obs = env->reset(11, {});
  ASSERT_TRUE(obs.ok());
  int secret = std::stoi(obs->metadata["answer"].get<std::string>());
  // Follow the reference transcript (binary search): ends solved within log2(16)+1 turns.
  const auto& turns = obs->metadata["reference_turns"];
  StepResult last;
  for (size_t i = 0; i < turns.size(); ++i) {
    auto s = env->step(turns[i].get<std::string>());
    ASSERT_TRUE(s.ok());
    int g = std::stoi(turns[i].get<std::string>());
    if (g != secret) {
      EXPECT_EQ(s->observation.text, g < secret ? "higher" : "lower");
    }
    EXPECT_EQ(s->done, i + 1 == turns.size());
    last = *s;
  }
  EXPECT_DOUBLE_EQ(last.reward, 1.0 - static_cast<double>(turns.size() - 1) / 5);
  EXPECT_EQ(last.info["termination"], "solved");
  EXPECT_FALSE(env->step("3").ok());  // episode over

  ASSERT_TRUE(env->reset(11, {}).ok());
  StepResult s;
  for (int i = 0; i < 5; ++i) s = *env->step("nothing");
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.reward, 0.0);
  EXPECT_EQ(s.info["termination"], "max_turns");
  EXPECT_EQ(env->verify(obs->metadata, std::to_string(secret))->reward, 1.0);
  expect_disjoint(*make("guess_number", {{"max_number", 1000}}), 200);
}

TEST(Calculator, MustCallToolThenAnswer) {
  auto env = make("calculator", {{"digits", 3}});
  ASSERT_EQ(env->info().tools.size(), 1u);
  EXPECT_EQ(env->info().tools[0].name, "calculator");
  auto obs = env->reset(5, {});
  const auto& ref = obs->metadata["reference_turns"];
  auto t1 = env->step(ref[0].get<std::string>());
  ASSERT_TRUE(t1.ok());
  EXPECT_FALSE(t1->done);
  const std::string answer = obs->metadata["answer"];
  EXPECT_NE(t1->observation.text.find("\"result\":\"" + answer + "\""), std::string::npos) << t1->observation.text;
  auto t2 = env->step(ref[1].get<std::string>());
  EXPECT_TRUE(t2->done);
  EXPECT_EQ(t2->reward, 1.0);

  ASSERT_TRUE(env->reset(5, {}).ok());  // right answer without the tool: format reward only
  auto direct = env->step("<answer>" + answer + "</answer>");
  EXPECT_DOUBLE_EQ(direct->reward, 0.1);

  ASSERT_TRUE(env->reset(5, {}).ok());  // a malformed call is shown to the model, the episode goes on
  auto bad = env->step("<tool_call>{\"name\": \"calculator\", \"arguments\": 5}</tool_call>");
  EXPECT_FALSE(bad->done);
  EXPECT_NE(bad->observation.text.find("error"), std::string::npos);
  expect_disjoint(*env, 200);
}

TEST(Calculator, NumbersHaveAllTheirDigitsAndConfigErrorsNameTheEnv) {
  auto env = make("calculator", {{"digits", 2}, {"terms", 3}, {"ops", "+"}});
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::string expr = env->reset(seed, {})->metadata["expression"];
    ASSERT_EQ(expr.size(), 8u) << expr;  // "12+34+56": three two-digit numbers
  }
  for (const json& cfg : {json{{"ops", ""}}, json{{"ops", "+/"}}, json{{"digits", 10}}, json{{"terms", 9}}}) {
    auto bad = EnvRegistry::global().create("calculator", cfg);
    ASSERT_FALSE(bad.ok()) << cfg.dump();
    EXPECT_NE(bad.error().message.find("env calculator"), std::string::npos) << bad.error().message;
  }
}

TEST(Verify, MissingMetadataNamesTheEnv) {
  for (const char* name : {"arithmetic", "calculator", "guess_number", "countdown"}) {
    auto v = make(name)->verify(json::object(), "<answer>1</answer>");
    ASSERT_FALSE(v.ok()) << name;
    EXPECT_EQ(v.error().message.rfind(std::string(name) + ": verify metadata", 0), 0u) << v.error().message;
  }
}

TEST(Tools, ParseToolCalls) {
  auto calls = parse_tool_calls(
      "I'll compute. <tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+2\"}}</tool_call>"
      "<tool_call>{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}</tool_call>"
      "<tool_call>not json</tool_call><tool_call>{\"arguments\": {}}</tool_call><tool_call>{\"name\":\"x\"}");
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_TRUE(calls[0].ok);
  EXPECT_EQ(calls[0].name, "calculator");
  EXPECT_EQ(calls[0].arguments["expression"], "1+2");
  EXPECT_TRUE(calls[1].ok);
  EXPECT_EQ(calls[1].arguments["q"], "x");
  EXPECT_FALSE(calls[2].ok);
  EXPECT_FALSE(calls[3].ok);
  EXPECT_FALSE(calls[4].ok);
  EXPECT_TRUE(parse_tool_calls("no calls here").empty());
  EXPECT_EQ(extract_last_tag("<answer> 1 </answer><answer>2</answer>", "answer"), "2");
  EXPECT_FALSE(extract_last_tag("<answer>open", "answer").has_value());
}
