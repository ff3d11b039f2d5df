// envs.serve_cli: `troupe env serve PLUGIN.so --bind ADDR` serves a C++ plug-in as its own process,
// started by troupe from a YAML-style command line with {bind}, and driven like any remote env.
#include <gtest/gtest.h>

#include "troupe/envs/client.h"

using namespace troupe::envs;

TEST(ServeCli, PluginAsRemoteProcess) {
  auto spec = parse_env_spec({{"name", "rev"},
                              {"type", "remote"},
                              {"command", {TROUPE_TEST_TROUPE, "env", "serve", std::string(TROUPE_TEST_LIB_DIR) + "/libreverse_env.so",
                                           "--bind", "{bind}", "--config", "{\"min_len\": 5, \"max_len\": 5}"}},
                              {"timeout_s", 10}},
                             "test");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  auto c = make_env_client(*spec);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ((*c)->info().name, "reverse");
  auto obs = (*c)->reset("e", 9, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  std::string w = obs->metadata["word"];
  EXPECT_EQ(w.size(), 5u);
  auto s = (*c)->step("e", std::string(w.rbegin(), w.rend()));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->reward, 1.0);
  EXPECT_TRUE(s->done);
}

TEST(ServeCli, BuiltinAndBadTargets) {
  auto ok = parse_env_spec({{"name", "g"}, {"command", {TROUPE_TEST_TROUPE, "env", "serve", "guess_number", "--bind", "{bind}"}}}, "t");
  auto c = make_env_client(*ok);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE((*c)->info().multi_turn);
  auto bad = parse_env_spec({{"name", "x"}, {"command", {TROUPE_TEST_TROUPE, "env", "serve", "nope", "--bind", "{bind}"}},
                             {"startup_timeout_s", 20}}, "t");
  auto e = make_env_client(*bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("exited with status 2"), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find("unknown built-in env 'nope'"), std::string::npos) << e.error().message;
}
