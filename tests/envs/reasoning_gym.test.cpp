// envs.reasoning_gym: `type: reasoning_gym` runs any reasoning-gym task through the Python SDK
// (reasoning-gym is installed on first use by ensure_reasoning_gym.py when troupe's Python lacks
// it): episodes score with the task's own verifier, task_config reaches the generator, a huge size
// costs nothing up front, the eval split never shares a question with train, a killed task process
// fails its call as worker_crash and is restarted, and a bad task name or config key is a start-up
// error (invalid_input) naming it.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <set>

#include "troupe/base/build_config.h"
#include "troupe/envs/client.h"

using namespace troupe::envs;

namespace {

std::string rg_python() {
  static const std::string py = [] {
    std::string out;
    FILE* p = ::popen((troupe::python_executable() + " " TROUPE_TEST_SOURCE_DIR "/tests/envs/ensure_reasoning_gym.py").c_str(), "r");
    char buf[4096];
    while (p && std::fgets(buf, sizeof buf, p)) out = buf;
    if (p) ::pclose(p);
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
  }();
  return py;
}

troupe::Result<std::unique_ptr<EnvClient>> rg(json config) {
  config["python"] = rg_python();
  auto spec = parse_env_spec({{"name", "rg"}, {"type", "reasoning_gym"}, {"config", config}, {"timeout_s", 30},
                              {"startup_timeout_s", 120}},
                             "test");
  if (!spec.ok()) return spec.error();
  return make_env_client(*spec);
}

}  // namespace

TEST(ReasoningGym, AnyTaskWithHeldOutSplit) {
  ASSERT_FALSE(rg_python().empty());
  auto c = rg({{"task", "basic_arithmetic"}, {"task_config", {{"min_terms", 2}, {"max_terms", 2}}},
               {"size", 10000000}, {"eval_size", 30}, {"seed", 5}});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EnvClient& env = **c;
  EXPECT_EQ(env.info().name, "reasoning_gym/basic_arithmetic");
  std::set<std::string> train_questions;
  for (uint64_t seed : {0ull, 1ull, 2ull, 9999999ull, 123456789012ull}) {
    auto obs = env.reset("t", seed, {});
    ASSERT_TRUE(obs.ok()) << obs.error().message;
    EXPECT_EQ(obs->metadata["split"], "train");
    auto good = env.step("t", obs->metadata["reference_completion"].get<std::string>());
    ASSERT_TRUE(good.ok()) << good.error().message;
    EXPECT_TRUE(good->done);
    EXPECT_EQ(good->reward, 1.0);
    auto wrong = env.verify(obs->metadata, "<answer>not a number</answer>");
    ASSERT_TRUE(wrong.ok());
    EXPECT_EQ(wrong->reward, 0.0);
    EXPECT_EQ(wrong->components["format"], 1.0);
    env.release("t");
  }
  for (uint64_t seed = 0; seed < 400; ++seed) {
    auto obs = env.reset("q", seed, {});
    ASSERT_TRUE(obs.ok());
    // task_config: two terms, e.g. "Calculate 12 + -3." (one operator between the terms)
    train_questions.insert(obs->text.substr(0, obs->text.find('\n')));
    env.release("q");
  }
  ResetOptions eval;
  eval.split = Split::eval;
  std::set<std::string> eval_questions;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    auto obs = env.reset("e", seed, eval);
    ASSERT_TRUE(obs.ok()) << obs.error().message;
    EXPECT_EQ(obs->metadata["split"], "eval");
    std::string q = obs->text.substr(0, obs->text.find('\n'));
    EXPECT_EQ(train_questions.count(q), 0u) << "in both splits: " << q;
    eval_questions.insert(q);
    auto v = env.verify(obs->metadata, obs->metadata["reference_completion"].get<std::string>());
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_EQ(v->reward, 1.0);
    env.release("e");
  }
  EXPECT_GT(eval_questions.size(), 20u);
  // seed wraps at eval_size: the same eval item again
  auto a = env.reset("w", 3, eval), b = env.reset("w2", 33, eval);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->text, b->text);
}

TEST(ReasoningGym, AnotherTaskAndBadInput) {
  auto legs = rg({{"task", "leg_counting"}, {"size", 1000}, {"eval_size", 5}});
  ASSERT_TRUE(legs.ok()) << legs.error().message;
  auto obs = (*legs)->reset("l", 7, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  EXPECT_NE(obs->text.find("legs"), std::string::npos) << obs->text;
  auto s = (*legs)->step("l", obs->metadata["reference_completion"].get<std::string>());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->reward, 1.0);
  // the task's process dies: that call fails as worker_crash, the env restarts it and goes on
  const int pid = (*legs)->worker_pid();
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);
  auto lost = (*legs)->verify(obs->metadata, "<answer>1</answer>");
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(termination_for(lost.error()), Termination::worker_crash) << lost.error().message;
  auto back = (*legs)->reset("l2", 7, {});
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->text, obs->text);
  EXPECT_EQ((*legs)->restarts(), 1);
  // a completion without the tags is still scored (format 0)
  auto bare = (*legs)->verify(back->metadata, back->metadata["answer"].get<std::string>());
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->reward, 1.0);
  EXPECT_EQ(bare->components["format"], 0.0);

  auto unknown = rg({{"task", "no_such_task_xyz"}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code, troupe::ErrorCode::invalid_input) << unknown.error().message;
  EXPECT_NE(unknown.error().message.find("no_such_task_xyz"), std::string::npos) << unknown.error().message;
  auto typo = rg({{"task", "basic_arithmetic"}, {"sizes", 3}});
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.error().message.find("sizes"), std::string::npos) << typo.error().message;
  auto notask = parse_env_spec({{"name", "rg"}, {"type", "reasoning_gym"}, {"config", json::object()}}, "cfg.yaml: envs[0]");
  ASSERT_FALSE(notask.ok());
  EXPECT_NE(notask.error().message.find("config 'task'"), std::string::npos);
}
