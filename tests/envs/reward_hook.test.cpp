// envs.reward_hook: the dataset env's `verifier: python` (builtin/reward_hook.h): the user's function
// gets the prompt, the response, the raw reference and the row; a float, a dict (summed) or a dict
// with `reward` score; a hang, a crash, an exception or a bad return fails that call only, with its
// reason, and the next call works; a module, file or function that cannot be loaded stops the start.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "troupe/base/clock.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/client.h"

using namespace troupe::envs;
namespace fs = std::filesystem;

namespace {

const char* kHook = R"(import os, time
def const(prompt, response, reference, row):
    return 0.5
def parts(prompt, response, reference, row):
    return {"correct": response.strip() == str(reference), "format": 0.25}
def with_reward(prompt, response, reference, row):
    return {"reward": 0.75, "bonus": 1, "penalty": -2.5}
def inspect(prompt, response, reference, row):
    print("printed output must not break the protocol")
    return {"prompt_ok": prompt == "Q: what is six times seven?", "ref_is_int": isinstance(reference, int),
            "ref": reference, "extra": len(row["extra"]), "row_answer_raw": row["answer"] == 42,
            "response_ok": response == "the answer is 42"}
def hang(prompt, response, reference, row):
    if response == "hang":
        time.sleep(600)
    return 1.0
def crash(prompt, response, reference, row):
    if response == "crash":
        os._exit(7)
    return 1.0
def boom(prompt, response, reference, row):
    raise ValueError("no reward for " + response)
def bad_type(prompt, response, reference, row):
    return "high"
def bad_value(prompt, response, reference, row):
    return {"correct": 1.0, "note": "great"}
def not_finite(prompt, response, reference, row):
    return float("nan")
def empty(prompt, response, reference, row):
    return {}
)";

struct Fixture : ::testing::Test {
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("troupe-reward-hook-" + std::to_string(::getpid()));
    fs::create_directories(dir / "pkg");
    std::ofstream(dir / "hook.py") << kHook;
    std::ofstream(dir / "pkg" / "__init__.py") << "";
    std::ofstream(dir / "pkg" / "scores.py") << "def one(p, r, ref, row):\n    return 1\n";
    std::ofstream(dir / "broken.py") << "import no_such_module_for_troupe\n";
    std::ofstream(dir / "rows.jsonl") << R"({"question": "what is six times seven?", "answer": 42, "extra": [1, 2, 3]})"
                                      << "\n";
  }
  void TearDown() override { fs::remove_all(dir); }

  json config(const std::string& reward, double timeout_s = 10) const {
    return {{"train", "rows.jsonl"}, {"base_dir", dir.string()}, {"template", "Q: {question}"},
            {"eval_fraction", 0.0}, {"verifier", "python"}, {"reward", reward}, {"reward_timeout_s", timeout_s},
            {"reward_workers", 1}};
  }
  std::unique_ptr<Env> env(const std::string& reward, double timeout_s = 10) const {
    auto e = make_dataset_env(config(reward, timeout_s));
    EXPECT_TRUE(e.ok()) << e.error().message;
    return e.ok() ? std::move(e).value() : nullptr;
  }
  static json metadata(Env& e) {
    auto obs = e.reset(0, {});
    EXPECT_TRUE(obs.ok()) << obs.error().message;
    return obs->metadata;
  }
  std::string start_error(const std::string& reward) const {
    auto e = make_dataset_env(config(reward));
    EXPECT_FALSE(e.ok()) << reward;
    if (e.ok()) return "";
    EXPECT_EQ(e.error().code, troupe::ErrorCode::invalid_input);
    return e.error().message;
  }
};

// The failure's reason, as the episode records it.
std::string reason(const troupe::Result<VerifyResult>& r) {
  return r.ok() ? "ok" : termination_name(termination_for(r.error()));
}

}  // namespace

using RewardHook = Fixture;

TEST_F(RewardHook, FloatDictSummedAndDictWithReward) {
  auto e = env("hook.py:const");
  json m = metadata(*e);
  auto v = e->verify(m, "x");
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->reward, 0.5);
  EXPECT_TRUE(v->components.empty());

  e = env("hook.py:parts");
  v = e->verify(metadata(*e), "42");
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->reward, 1.25);  // the components' sum
  EXPECT_EQ(v->components.at("correct"), 1.0);
  EXPECT_EQ(v->components.at("format"), 0.25);
  EXPECT_EQ(e->verify(metadata(*e), "41")->reward, 0.25);

  e = env("hook.py:with_reward");
  v = e->verify(metadata(*e), "x");
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->reward, 0.75);  // `reward` wins; the other keys are components
  EXPECT_EQ(v->components.size(), 2u);
  EXPECT_EQ(v->components.at("bonus"), 1.0);
  EXPECT_EQ(v->components.at("penalty"), -2.5);

  // a module name (found beside the YAML: base_dir is on sys.path)
  e = env("pkg.scores:one");
  EXPECT_EQ(e->verify(metadata(*e), "x")->reward, 1.0);
}

TEST_F(RewardHook, GetsPromptRawReferenceAndWholeRow) {
  auto e = env("hook.py:inspect");
  json m = metadata(*e);
  auto v = e->verify(m, "the answer is 42");
  ASSERT_TRUE(v.ok()) << v.error().message;
  for (const char* k : {"prompt_ok", "ref_is_int", "row_answer_raw", "response_ok"}) EXPECT_EQ(v->components.at(k), 1.0) << k;
  EXPECT_EQ(v->components.at("ref"), 42.0);
  EXPECT_EQ(v->components.at("extra"), 3.0);
  // step() of the single-turn episode scores through the same hook
  ASSERT_TRUE(e->reset(0, {}).ok());
  auto s = e->step("the answer is 42");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->components.at("response_ok"), 1.0);
}

TEST_F(RewardHook, HangIsKilledAtTheDeadlineAndReplaced) {
  auto e = env("hook.py:hang", 0.5);
  json m = metadata(*e);
  const double t0 = troupe::mono_seconds();
  auto v = e->verify(m, "hang");
  EXPECT_LT(troupe::mono_seconds() - t0, 5.0);
  EXPECT_EQ(reason(v), "reward_timeout");
  EXPECT_NE(v.error().message.find("reward_timeout_s 0.5"), std::string::npos) << v.error().message;
  EXPECT_EQ(e->verify(m, "fine")->reward, 1.0);  // a fresh worker
}

TEST_F(RewardHook, CrashFailsTheCallAndTheWorkerRestarts) {
  auto e = env("hook.py:crash");
  json m = metadata(*e);
  auto v = e->verify(m, "crash");
  EXPECT_EQ(reason(v), "reward_crash");
  EXPECT_NE(v.error().message.find("exited with status 7"), std::string::npos) << v.error().message;
  EXPECT_EQ(e->verify(m, "fine")->reward, 1.0);
  EXPECT_EQ(reason(e->verify(m, "crash")), "reward_crash");
  EXPECT_EQ(e->verify(m, "fine")->reward, 1.0);
}

TEST_F(RewardHook, ExceptionAndBadReturnsAreNamed) {
  auto e = env("hook.py:boom");
  json m = metadata(*e);
  auto v = e->verify(m, "this");
  EXPECT_EQ(reason(v), "reward_error");
  EXPECT_NE(v.error().message.find("ValueError: no reward for this"), std::string::npos) << v.error().message;

  e = env("hook.py:bad_type");
  v = e->verify(m, "x");
  EXPECT_EQ(reason(v), "reward_bad_return");
  EXPECT_NE(v.error().message.find("returned str 'high', not a float or a dict"), std::string::npos) << v.error().message;

  e = env("hook.py:bad_value");
  v = e->verify(m, "x");
  EXPECT_EQ(reason(v), "reward_bad_return");
  EXPECT_NE(v.error().message.find("key 'note'"), std::string::npos) << v.error().message;

  e = env("hook.py:not_finite");
  EXPECT_EQ(reason(e->verify(m, "x")), "reward_bad_return");
  e = env("hook.py:empty");
  EXPECT_EQ(reason(e->verify(m, "x")), "reward_bad_return");
  EXPECT_EQ(e->verify({{"row", "elsewhere:1"}}, "x").error().code, troupe::ErrorCode::invalid_input);
}

TEST_F(RewardHook, WhatCannotBeLoadedIsAnErrorAtStart) {
  std::string m = start_error("hook.py:no_such_function");
  EXPECT_NE(m.find("no function 'no_such_function'"), std::string::npos) << m;
  EXPECT_NE(m.find((dir / "hook.py").string()), std::string::npos) << m;
  m = start_error("missing_file.py:score");
  EXPECT_NE(m.find((dir / "missing_file.py").string() + " does not exist"), std::string::npos) << m;
  m = start_error("no_such_module_here:score");
  EXPECT_NE(m.find("cannot import module 'no_such_module_here'"), std::string::npos) << m;
  m = start_error("broken.py:score");  // the file's own import fails
  EXPECT_NE(m.find("no_such_module_for_troupe"), std::string::npos) << m;
  m = start_error("hook.py");
  EXPECT_NE(m.find("MODULE:FUNCTION"), std::string::npos) << m;
  json c = config("hook.py:const");
  c["python"] = "/nonexistent/python3";
  auto e = make_dataset_env(c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("/nonexistent/python3"), std::string::npos) << e.error().message;
  c = config("hook.py:const");
  c["verifier"] = "exact";
  EXPECT_FALSE(make_dataset_env(c).ok());  // `reward` without verifier: python
  c.erase("reward");
  c["verifier"] = "python";
  EXPECT_FALSE(make_dataset_env(c).ok());  // verifier: python without `reward`
}

// In an isolated env worker the hook's failures keep their reasons and the env worker is not restarted.
TEST_F(RewardHook, IsolatedEnvKeepsTheReasons) {
  json c = config("hook.py:hang", 0.5);
  auto spec = parse_env_spec({{"name", "dataset"}, {"isolate", true}, {"config", c}, {"timeout_s", 20}}, "test");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  auto client = make_env_client(*spec);
  ASSERT_TRUE(client.ok()) << client.error().message;
  auto obs = (*client)->reset("ep", 0, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  EXPECT_EQ(reason((*client)->verify(obs->metadata, "hang")), "reward_timeout");
  EXPECT_EQ((*client)->verify(obs->metadata, "fine")->reward, 1.0);
  EXPECT_EQ((*client)->restarts(), 0);
}
