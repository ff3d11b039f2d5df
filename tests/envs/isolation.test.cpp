// envs.isolation: envs in a troupe-env-worker process. A plug-in that segfaults, exits, throws or
// hangs fails only its episode, with the reason; the worker is restarted and other episodes go on.
#include <gtest/gtest.h>

#include <chrono>

#include "troupe/envs/client.h"

using namespace troupe::envs;

namespace {

std::string lib(const std::string& name) { return std::string(TROUPE_TEST_LIB_DIR) + "/lib" + name + ".so"; }

std::unique_ptr<EnvClient> faulty_client(const std::string& fault, double timeout_s = 2.0) {
  auto spec = parse_env_spec({{"name", "faulty"}, {"path", lib("faulty_env")}, {"config", {{"fault", fault}}},
                              {"timeout_s", timeout_s}, {"startup_timeout_s", 20}},
                             "test");
  EXPECT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_TRUE(spec->isolate);  // plug-ins are isolated by default
  auto c = make_env_client(*spec);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return std::move(c).value();
}

// An episode on another session survives nothing: it was on the dead worker. A new one works.
void expect_recovers(EnvClient& c, const std::string& tag) {
  auto obs = c.reset("after-" + tag, 7, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  auto s = c.step("after-" + tag, "fine");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->reward, 1.0);
  EXPECT_EQ(c.verify({}, "fine")->reward, 0.5);
}

}  // namespace

TEST(Isolation, BuiltinInWorker) {
  auto spec = parse_env_spec({{"name", "arithmetic"}, {"isolate", true}, {"config", {{"digits", 2}}}}, "test");
  ASSERT_TRUE(spec.ok());
  auto c = make_env_client(*spec);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ((*c)->info().name, "arithmetic");
  // Several episodes interleaved on one worker.
  std::vector<Observation> obs;
  for (int i = 0; i < 4; ++i) obs.push_back(*(*c)->reset("ep" + std::to_string(i), static_cast<uint64_t>(i), {}));
  for (int i = 3; i >= 0; --i) {
    auto s = (*c)->step("ep" + std::to_string(i), obs[static_cast<size_t>(i)].metadata["answer"].get<std::string>());
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_EQ(s->reward, 1.0);
    (*c)->release("ep" + std::to_string(i));
  }
  EXPECT_EQ((*c)->verify(obs[0].metadata, "nope")->reward, 0.0);
  auto unknown = (*c)->step("never-reset", "1");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code, troupe::ErrorCode::invalid_input);
  EXPECT_NE(unknown.error().message.find("unknown episode 'never-reset'"), std::string::npos);
  EXPECT_EQ((*c)->restarts(), 0);
}

TEST(Isolation, BadConfigFailsAtStartWithTheWorkersMessage) {
  auto spec = parse_env_spec({{"name", "arithmetic"}, {"isolate", true}, {"config", {{"digits", 99}}}}, "test");
  ASSERT_TRUE(spec.ok());
  auto c = make_env_client(*spec);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("exited with status 2"), std::string::npos) << c.error().message;
  EXPECT_NE(c.error().message.find("'digits' must be between 1 and 9"), std::string::npos) << c.error().message;
}

TEST(Isolation, SegfaultInStep) {
  auto c = faulty_client("segfault");
  ASSERT_TRUE(c->reset("victim", 1, {}).ok());
  ASSERT_TRUE(c->reset("bystander", 2, {}).ok());
  auto r = c->step("victim", "BOOM");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(termination_for(r.error()), Termination::worker_crash);
  EXPECT_NE(r.error().message.find("killed by signal 11"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("step of episode 'victim'"), std::string::npos) << r.error().message;
  EXPECT_EQ(c->restarts(), 1);
  // The bystander lived on the dead worker: it fails clearly, it does not hang or succeed wrongly.
  auto lost = c->step("bystander", "fine");
  ASSERT_FALSE(lost.ok());
  EXPECT_NE(lost.error().message.find("lost when the env worker restarted"), std::string::npos) << lost.error().message;
  c->release("victim");
  c->release("bystander");
  expect_recovers(*c, "segv");
}

TEST(Isolation, ExitInVerify) {
  auto c = faulty_client("exit");
  auto r = c->verify({}, "BOOM");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(termination_for(r.error()), Termination::worker_crash);
  EXPECT_NE(r.error().message.find("exited with status 3"), std::string::npos) << r.error().message;
  expect_recovers(*c, "exit");
}

TEST(Isolation, ThrowIsAnEnvErrorAndTheWorkerStays) {
  auto c = faulty_client("throw");
  ASSERT_TRUE(c->reset("e", 1, {}).ok());
  auto r = c->step("e", "BOOM");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(termination_for(r.error()), Termination::env_error);
  EXPECT_NE(r.error().message.find("threw a C++ exception"), std::string::npos) << r.error().message;
  EXPECT_EQ(c->restarts(), 0);
  expect_recovers(*c, "throw");
}

TEST(Isolation, HangInVerifierTimesOut) {
  auto c = faulty_client("hang", 0.5);
  auto t0 = std::chrono::steady_clock::now();
  auto r = c->verify({}, "BOOM");
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(termination_for(r.error()), Termination::timeout);
  EXPECT_NE(r.error().message.find("no answer to verify within 0.5 s"), std::string::npos) << r.error().message;
  EXPECT_LT(waited, 10.0);
  EXPECT_EQ(c->restarts(), 1);
  expect_recovers(*c, "hang");
}

TEST(Isolation, HangInResetThenGiveUpAfterMaxRestarts) {
  auto spec = parse_env_spec({{"name", "faulty"}, {"path", lib("faulty_env")}, {"config", {{"fault", "segfault"}}},
                              {"max_restarts", 1}},
                             "test");
  auto c = std::move(make_env_client(*spec)).value();
  EXPECT_FALSE(c->reset("a", 666, {}).ok());  // crash 1: restarted
  auto second = c->reset("b", 666, {});       // crash 2: out of restarts
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("gave up after 1 env worker restarts"), std::string::npos) << second.error().message;
  EXPECT_EQ(second.error().code, troupe::ErrorCode::peer_failed);
}
