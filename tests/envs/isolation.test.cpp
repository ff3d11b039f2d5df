// envs.isolation: envs in a troupe-env-worker process. A plug-in that segfaults, exits, throws or
// hangs fails only its episode, with the reason; the worker is restarted and other episodes go on.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "troupe/envs/client.h"
#include "troupe/envs/remote.h"

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

TEST(Remote, ConnectsToARunningServer) {
  auto local = make_served_env("countdown", R"({"num_numbers": 3})");
  ASSERT_TRUE(local.ok()) << local.error().message;
  std::atomic<bool> stop{false};
  const std::string addr = "ipc:///tmp/troupe-envs-test-" + std::to_string(::getpid()) + ".sock";
  troupe::Status served;
  std::thread server([&] {
    ServeOptions o;
    o.bind = addr;
    o.stop = &stop;
    o.poll_ms = 20;
    served = serve_env(std::move(local).value(), o);
  });
  auto spec = parse_env_spec({{"name", "cd"}, {"address", addr}, {"timeout_s", 10}}, "test");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->type, EnvType::remote);
  {
    auto c = make_env_client(*spec);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ((*c)->info().name, "countdown");
    EXPECT_EQ((*c)->worker_pid(), -1);
    auto obs = (*c)->reset("x", 5, {});
    ASSERT_TRUE(obs.ok()) << obs.error().message;
    auto s = (*c)->step("x", obs->metadata["reference_completion"].get<std::string>());
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->reward, 1.0);
    (*c)->release("x");
  }
  stop = true;
  server.join();
  EXPECT_TRUE(served.ok());
  std::filesystem::remove(addr.substr(6));
}

TEST(Remote, ProtocolErrorsAreReplies) {
  EnvRequestHandler h(std::move(make_served_env("arithmetic", "")).value());
  EXPECT_EQ(h.handle({{"op", "hello"}, {"id", 1}})["result"]["protocol"], "troupe.env/1");
  for (const json& bad : {json::array(), json{{"id", 2}}, json{{"op", "dance"}, {"id", 3}},
                          json{{"op", "reset"}, {"id", 4}}, json{{"op", "reset"}, {"session", "s"}, {"seed", -1}},
                          json{{"op", "reset"}, {"session", "s"}, {"options", {{"split", "holdout"}}}},
                          json{{"op", "step"}, {"session", "s"}}, json{{"op", "verify"}, {"metadata", {}}}}) {
    json r = h.handle(bad);
    EXPECT_FALSE(r["ok"].get<bool>()) << bad.dump();
    EXPECT_EQ(r["error"]["code"], "invalid_input") << bad.dump();
    EXPECT_FALSE(r["error"]["message"].get<std::string>().empty());
  }
  EXPECT_FALSE(h.shutdown_requested());
  EXPECT_TRUE(h.handle({{"op", "shutdown"}, {"id", 9}})["ok"].get<bool>());
  EXPECT_TRUE(h.shutdown_requested());
  EXPECT_FALSE(make_served_env("arithmetic", "{nope").ok());
  EXPECT_FALSE(make_served_env("no_such_builtin", "").ok());
  EXPECT_FALSE(make_served_env("/nonexistent/x.so", "").ok());
}

TEST(Specs, ParseAndReject) {
  auto list = parse_env_specs(json::parse(R"([
    {"name": "arithmetic", "weight": 2, "config": {"digits": 1}},
    {"name": "cd", "type": "builtin", "env": "countdown"},
    {"name": "rev", "type": "plugin", "path": "libreverse_env.so"},
    {"name": "py", "command": "python my_env.py --flag"}])"),
                              "cfg.yaml: envs");
  ASSERT_TRUE(list.ok()) << list.error().message;
  EXPECT_EQ((*list)[0].weight, 2.0);
  EXPECT_EQ((*list)[1].env, "countdown");
  EXPECT_TRUE((*list)[2].isolate);
  EXPECT_EQ((*list)[3].type, EnvType::remote);
  EXPECT_EQ((*list)[3].command.size(), 3u);
  struct Bad {
    const char* json;
    const char* expect;
  };
  for (const Bad& b : {Bad{R"([{"type": "builtin"}])", "envs[0]: env needs a 'name'"},
                       Bad{R"([{"name": "nope"}])", "envs[0]: unknown built-in env 'nope'"},
                       Bad{R"([{"name": "a", "type": "plugin"}])", "needs 'path'"},
                       Bad{R"([{"name": "a", "type": "remote"}])", "needs 'command'"},
                       Bad{R"([{"name": "arithmetic", "wieght": 1}])", "unknown key 'wieght'"},
                       Bad{R"([{"name": "arithmetic", "weight": -1}])", "'weight' must be >= 0"},
                       Bad{R"([{"name": "arithmetic"}, {"name": "arithmetic"}])", "duplicate env name"},
                       Bad{R"([{"name": "arithmetic", "type": "docker"}])", "'type' must be builtin, plugin"},
                       Bad{R"([{"name": "a", "type": "verifiers"}])", "a verifiers env needs 'address'"},
                       Bad{R"([])", "non-empty list"}}) {
    auto r = parse_env_specs(json::parse(b.json), "cfg.yaml: envs");
    ASSERT_FALSE(r.ok()) << b.json;
    EXPECT_NE(r.error().message.find(b.expect), std::string::npos) << r.error().message;
    EXPECT_EQ(r.error().message.rfind("cfg.yaml: envs", 0), 0u) << r.error().message;
  }
  auto bad_worker = parse_env_spec({{"name", "arithmetic"}, {"isolate", true}, {"worker", "/nonexistent/w"}}, "t");
  ASSERT_TRUE(bad_worker.ok());
  auto c = make_env_client(*bad_worker);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("/nonexistent/w"), std::string::npos);
}

TEST(Isolation, MultiTurnToolEnvInWorker) {
  auto spec = parse_env_spec({{"name", "calc"}, {"env", "calculator"}, {"isolate", true}}, "test");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  auto c = make_env_client(*spec);
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ((*c)->info().tools.size(), 1u);  // tools cross the protocol in hello
  EXPECT_EQ((*c)->info().tools[0].parameters["required"][0], "expression");
  EXPECT_TRUE((*c)->info().multi_turn);
  auto obs = (*c)->reset("t", 4, {});
  ASSERT_TRUE(obs.ok());
  const auto& turns = obs->metadata["reference_turns"];
  auto t1 = (*c)->step("t", turns[0].get<std::string>());
  ASSERT_TRUE(t1.ok());
  EXPECT_FALSE(t1->done);
  ASSERT_TRUE(t1->info["tool_calls"].is_array());
  EXPECT_EQ(t1->info["tool_calls"][0]["result"], obs->metadata["answer"]);
  auto t2 = (*c)->step("t", turns[1].get<std::string>());
  ASSERT_TRUE(t2.ok());
  EXPECT_TRUE(t2->done);
  EXPECT_EQ(t2->reward, 1.0);
  EXPECT_EQ(t2->components["tool_used"], 1.0);
}
