// envs.plugin: .so plug-ins loaded in-process through the C ABI: the example works, and every
// loading failure (missing file, missing symbol, ABI mismatch, create error, bad JSON) is a clear error.
#include <gtest/gtest.h>

#include "troupe/envs/client.h"
#include "troupe/envs/plugin.h"

using namespace troupe::envs;

namespace {
std::string lib(const std::string& name) { return std::string(TROUPE_TEST_LIB_DIR) + "/lib" + name + ".so"; }
}  // namespace

TEST(Plugin, ExampleReverseEnv) {
  auto f = plugin_factory(lib("reverse_env"));
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto env = (*f)({{"min_len", 4}, {"max_len", 4}});
  ASSERT_TRUE(env.ok()) << env.error().message;
  EXPECT_EQ((*env)->info().name, "reverse");
  EXPECT_EQ((*env)->info().version, "1.0");
  auto obs = (*env)->reset(1, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  std::string word = obs->metadata["word"];
  EXPECT_EQ(word.size(), 4u);
  std::string rev(word.rbegin(), word.rend());
  EXPECT_EQ((*env)->verify(obs->metadata, rev)->reward, 1.0);
  EXPECT_EQ((*env)->verify(obs->metadata, word + "x")->reward, 0.0);
  auto step = (*env)->step(rev);
  ASSERT_TRUE(step.ok());
  EXPECT_TRUE(step->done);
  EXPECT_EQ(step->reward, 1.0);
  ResetOptions eval;
  eval.split = Split::eval;
  auto held = (*env)->reset(1, eval);
  EXPECT_NE(held->metadata["word"], word);
  (*env)->release();
  EXPECT_FALSE((*f)({{"min_len", 5}, {"max_len", 2}}).ok());
}

TEST(Plugin, LoadErrorsAreClear) {
  auto missing = load_plugin("/nonexistent/libnope.so");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("/nonexistent/libnope.so"), std::string::npos);

  auto nosym = load_plugin(lib("faulty_noinit_env"));
  ASSERT_FALSE(nosym.ok());
  EXPECT_NE(nosym.error().message.find("missing symbol troupe_env_plugin_init"), std::string::npos) << nosym.error().message;

  auto abi = load_plugin(lib("faulty_abi99_env"));
  ASSERT_FALSE(abi.ok());
  EXPECT_NE(abi.error().message.find("ABI version mismatch: plug-in has 99, troupe expects 1"), std::string::npos)
      << abi.error().message;

  auto f = plugin_factory(lib("faulty_env"));
  ASSERT_TRUE(f.ok());
  auto refused = (*f)({{"fail_create", true}});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("create refused"), std::string::npos);
}

TEST(Plugin, BadResultsAndThrowsBecomeErrors) {
  auto f = plugin_factory(lib("faulty_env"));
  ASSERT_TRUE(f.ok());
  auto env = std::move((*f)({{"fault", "throw"}})).value();
  ASSERT_TRUE(env->reset(1, {}).ok());
  auto bad = env->step("BADJSON");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("invalid JSON"), std::string::npos);
  auto refused = env->verify({}, "FAIL");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("verifier refused"), std::string::npos);
  auto threw = env->verify({}, "BOOM");
  ASSERT_FALSE(threw.ok());
  EXPECT_NE(threw.error().message.find("threw a C++ exception"), std::string::npos);
  EXPECT_EQ(env->verify({}, "fine")->reward, 0.5);  // still usable
}

TEST(Plugin, InProcessClientFromSpec) {
  auto spec = parse_env_spec({{"name", "rev"}, {"type", "plugin"}, {"path", lib("reverse_env")}, {"isolate", false}}, "test");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  auto client = make_env_client(*spec);
  ASSERT_TRUE(client.ok()) << client.error().message;
  auto obs = (*client)->reset("e1", 3, {});
  ASSERT_TRUE(obs.ok());
  std::string w = obs->metadata["word"];
  auto s = (*client)->step("e1", std::string(w.rbegin(), w.rend()));
  EXPECT_EQ(s->reward, 1.0);
  (*client)->release("e1");
  EXPECT_FALSE((*client)->step("e1", "x").ok());  // released
}
