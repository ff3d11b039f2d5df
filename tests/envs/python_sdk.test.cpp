// envs.python_sdk: the Python SDK server (envs/python) started by troupe from a command line and
// driven from C++: the reasoning-gym example runs episodes, Python exceptions become env errors,
// and a killed SDK process is detected and restarted.
#include <gtest/gtest.h>
#include <signal.h>

#include "troupe/base/build_config.h"
#include "troupe/envs/client.h"

using namespace troupe::envs;

namespace {

EnvSpec sdk_spec(const std::string& example, json config) {
  auto spec = parse_env_spec({{"name", "py"},
                              {"type", "remote"},
                              {"command", {troupe::python_executable(), std::string(TROUPE_TEST_ENVS_DIR) + "/python/examples/" + example}},
                              {"config", std::move(config)},
                              {"timeout_s", 20},
                              {"startup_timeout_s", 60}},
                             "test");
  EXPECT_TRUE(spec.ok()) << spec.error().message;
  return *spec;
}

}  // namespace

TEST(PythonSdk, ReasoningGymEpisodes) {
  auto c = make_env_client(sdk_spec("reasoning_gym_env.py", {{"dataset", "basic_arithmetic"}, {"size", 20}, {"eval_size", 10}}));
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ((*c)->info().name, "reasoning_gym/basic_arithmetic");
  for (int i = 0; i < 3; ++i) {
    const std::string id = "ep" + std::to_string(i);
    auto obs = (*c)->reset(id, static_cast<uint64_t>(i), {});
    ASSERT_TRUE(obs.ok()) << obs.error().message;
    EXPECT_NE(obs->text.find("<answer>"), std::string::npos);
    const std::string ref = obs->metadata["reference_completion"];
    auto s = (*c)->step(id, i == 1 ? "<answer>wrong</answer>" : ref);
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_TRUE(s->done);
    EXPECT_EQ(s->reward, i == 1 ? 0.0 : 1.0);
    EXPECT_EQ(s->components["format"], 1.0);
    (*c)->release(id);
  }
  ResetOptions eval;
  eval.split = Split::eval;
  auto held = (*c)->reset("held", 0, eval);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->metadata["split"], "eval");
  auto v = (*c)->verify(held->metadata, held->metadata["reference_completion"].get<std::string>());
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->reward, 1.0);
  // A Python exception in user code is an error reply; the server keeps serving.
  auto bad = (*c)->verify({{"split", "train"}}, "x");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(termination_for(bad.error()), Termination::env_error);
  EXPECT_NE(bad.error().message.find("metadata needs the 'index'"), std::string::npos) << bad.error().message;
  EXPECT_TRUE((*c)->verify(held->metadata, "<answer>0</answer>").ok());
  EXPECT_EQ((*c)->restarts(), 0);
}

TEST(PythonSdk, BadConfigIsReportedAtStart) {
  auto c = make_env_client(sdk_spec("reasoning_gym_env.py", {{"no_such_key", 1}}));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("unknown config keys ['no_such_key']"), std::string::npos) << c.error().message;
}

TEST(PythonSdk, KilledServerIsRestarted) {
  auto c = make_env_client(sdk_spec("arithmetic_env.py", json::object()));
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto obs = (*c)->reset("a", 1, {});
  ASSERT_TRUE(obs.ok());
  auto s = (*c)->step("a", obs->metadata["answer"].get<std::string>());
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->reward, 1.0);
  ASSERT_TRUE((*c)->reset("b", 2, {}).ok());
  int pid = (*c)->worker_pid();
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);  // the SDK process dies behind the client's back
  auto lost = (*c)->step("b", "3");
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(termination_for(lost.error()), Termination::worker_crash);
  EXPECT_NE(lost.error().message.find("killed by signal 9"), std::string::npos) << lost.error().message;
  EXPECT_EQ((*c)->restarts(), 1);
  EXPECT_NE((*c)->worker_pid(), pid);
  auto again = (*c)->reset("c", 3, {});
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ((*c)->verify(again->metadata, again->metadata["answer"].get<std::string>())->reward, 1.0);
}

TEST(PythonSdk, MultiTurnStep) {
  auto c = make_env_client(sdk_spec("guess_word_env.py", {{"max_turns", 4}}));
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE((*c)->info().multi_turn);
  auto obs = (*c)->reset("w", 5, {});
  ASSERT_TRUE(obs.ok());
  const std::string word = obs->metadata["answer"];
  auto miss = (*c)->step("w", "zzz");
  ASSERT_TRUE(miss.ok()) << miss.error().message;
  EXPECT_FALSE(miss->done);
  EXPECT_EQ(miss->observation.text, "Not quite: ___");
  auto hit = (*c)->step("w", word);
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(hit->done);
  EXPECT_DOUBLE_EQ(hit->reward, 0.75);
  EXPECT_EQ(hit->info["termination"], "solved");
  (*c)->release("w");
  ResetOptions eval;
  eval.split = Split::eval;
  auto held = (*c)->reset("h", 5, eval);
  for (const char* w : {"cat", "dog", "sun", "map", "pen", "cup", "hat", "box"}) EXPECT_NE(held->metadata["answer"], w);
  auto bad = make_env_client(sdk_spec("guess_word_env.py", {{"max_turns", 0}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("max_turns must be >= 1"), std::string::npos) << bad.error().message;
}
