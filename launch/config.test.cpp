// launch.config_*: every kind of config error is reported as FILE:LINE:COL: error: key: ..., with
// suggestions for near misses; --set is typed by the schema; the resolved config loads back the
// same. launch.config_readme: configs/README.md agrees with the schema (every key, its default and
// its range); launch.docs_yaml_keys: every YAML key the other READMEs and docs/*.md name is one of its keys.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "troupe/base/build_config.h"
#include "troupe/kernels/backend.h"
#include "troupe/kernels/device.h"
#include "troupe/launch/config.h"

using namespace troupe::launch;

namespace {

const char* kMinimal = "envs:\n  - name: arithmetic\n";

std::string load_error(const std::string& text, const std::vector<std::string>& sets = {}) {
  auto r = load_config_text(text, "x.yaml", sets);
  EXPECT_FALSE(r.ok()) << "expected an error for:\n" << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.error().code, troupe::ErrorCode::invalid_input);
  return r.error().message;
}

}  // namespace

TEST(Config, Valid) {
  auto r = load_config_text(
      "run:\n  dir: /tmp/r\n  seed: 7\nrollout:\n  temperature: 0.5\n  stop: [\"\\n\", \"END\"]\n"
      "policy:\n  model:\n    mlp_only_layers: [0]\n    hidden_size: 64\n"
      "envs:\n  - name: arithmetic\n    weight: 2\n    config: {difficulty: 2, ops: [add, sub]}\n",
      "x.yaml");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const auto& c = r->config;
  EXPECT_EQ(c.run.dir, "/tmp/r");
  EXPECT_EQ(c.run.seed, 7);
  EXPECT_FLOAT_EQ(c.rollout.temperature, 0.5f);
  ASSERT_EQ(c.rollout.stop.size(), 2u);
  EXPECT_EQ(c.rollout.stop[0], "\n");
  EXPECT_EQ(c.policy.model.mlp_only_layers, std::vector<int>{0});
  EXPECT_EQ(c.policy.model.hidden_size, 64);
  ASSERT_EQ(c.envs.size(), 1u);
  EXPECT_EQ(c.envs[0].weight, 2.0);
  EXPECT_EQ(c.envs[0].config["difficulty"], 2);
  EXPECT_EQ(c.envs[0].config["ops"][1], "sub");
  EXPECT_EQ(r->mark_of("rollout.temperature"), (std::pair<int, int>{5, 3}));
}

// An entry without `type` gets it from its keys: .so path -> plugin, url -> nemo_gym, command or
// address -> remote, else builtin; an explicit type always wins. The resolved config names it.
TEST(Config, EnvTypeInferred) {
  auto r = load_config_text(
      "envs:\n  - name: arithmetic\n  - name: rev\n    path: lib/librev.so\n"
      "  - name: mine\n    command: [python, my_env.py]\n    cwd: envs\n    environment: {PYTHONPATH: ., N: 3}\n"
      "  - name: there\n    address: tcp://127.0.0.1:5555\n  - name: ng\n    url: http://127.0.0.1:8000\n"
      "    config: {data: rows.jsonl}\n  - name: ng2\n    type: nemo_gym\n    command: [python, s.py, --port, \"{port}\"]\n"
      "    config: {data: rows.jsonl}\n",
      "x.yaml");
  ASSERT_TRUE(r.ok()) << r.error().message;
  using troupe::actors::EnvType;
  const auto& e = r->config.envs;
  ASSERT_EQ(e.size(), 6u);
  EXPECT_EQ(e[0].type, EnvType::builtin);
  EXPECT_EQ(e[1].type, EnvType::plugin);
  EXPECT_EQ(e[2].type, EnvType::remote);
  EXPECT_EQ(e[2].cwd, "envs");
  EXPECT_EQ(e[2].environment["N"], 3);
  EXPECT_EQ(e[3].type, EnvType::remote);
  EXPECT_EQ(e[4].type, EnvType::nemo_gym);
  EXPECT_EQ(e[5].type, EnvType::nemo_gym);
  auto back = load_config_text(resolved_yaml(r->config), "config.resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->config.envs[2].type, EnvType::remote);
  EXPECT_EQ(back->config.envs[2].environment, e[2].environment);
  // environment/cwd need a process troupe starts
  EXPECT_NE(load_error("envs:\n  - name: arithmetic\n    cwd: x\n").find("envs[0].cwd: environment and cwd are for a command"),
            std::string::npos);
  EXPECT_NE(load_error("envs:\n  - name: m\n    command: [a]\n    environment: {A: [1]}\n").find("A must be a string"),
            std::string::npos);
  // a path that is not a .so stays builtin, and the check says what path is for
  EXPECT_NE(load_error("envs:\n  - name: x\n    path: x.py\n").find("path is only for type: plugin"), std::string::npos);
}

TEST(Config, UnknownKey) {
  auto m = load_error(std::string(kMinimal) + "rollout:\n  temprature: 0.5\n");
  EXPECT_NE(m.find("x.yaml:4:3: error: rollout.temprature: unknown key; did you mean 'rollout.temperature'?"),
            std::string::npos)
      << m;
  m = load_error(std::string(kMinimal) + "grpo:\n  temperature: 0.5\n");
  EXPECT_NE(m.find("'temperature' is a key of 'rollout.temperature'"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "rolout:\n  temperature: 0.5\n");
  EXPECT_NE(m.find("x.yaml:3:1: error: rolout: unknown key; did you mean 'rollout'?"), std::string::npos) << m;
  m = load_error("envs:\n  - name: arithmetic\n    wieght: 2\n");
  EXPECT_NE(m.find("x.yaml:3:5: error: envs[0].wieght: unknown key; did you mean 'envs[0].weight'?"), std::string::npos)
      << m;
}

TEST(Config, DuplicateKey) {
  auto m = load_error(std::string(kMinimal) + "run:\n  seed: 1\n  dir: a\n  seed: 2\n");
  EXPECT_NE(m.find("x.yaml:6:3: error: run.seed: duplicate key (first defined at line 4)"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "run:\n  seed: 1\nrun:\n  dir: b\n");
  EXPECT_NE(m.find("x.yaml:5:1: error: run: duplicate key"), std::string::npos) << m;
  m = load_error("envs:\n  - name: arithmetic\n    config: {a: 1, a: 2}\n");
  EXPECT_NE(m.find("envs[0].config.a: duplicate key"), std::string::npos) << m;
}

TEST(Config, TabIndentation) {
  auto m = load_error(std::string(kMinimal) + "run:\n\tseed: 1\n");
  EXPECT_NE(m.find("x.yaml:4:1: error: tab character in indentation"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "run:\n  \tseed: 1\n");
  EXPECT_NE(m.find("x.yaml:4:3: error: tab character"), std::string::npos) << m;
}

// Validating a policy.device: cuda config never touches a GPU or the CUDA runtime: it passes on a
// machine without one when the build has CUDA (the model reports a missing GPU when it starts), and
// names the missing CUDA in a build without it.
TEST(Config, CudaDeviceValidatesWithoutTouchingTheRuntime) {
  const int before = troupe::kernels::cuda_runtime_queries();
  const std::string text = std::string(kMinimal) + "policy:\n  device: cuda\n  share_gpu: true\n";
  auto r = load_config_text(text, "x.yaml", {});
  if (troupe::kernels::check_device_built("cuda").ok()) {
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->config.policy.device, troupe::kernels::DeviceKind::cuda);
    EXPECT_TRUE(r->config.policy.share_gpu);
  } else {
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("x.yaml:4:"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("error: policy.device: this build of troupe has no CUDA"), std::string::npos)
        << r.error().message;
  }
  EXPECT_EQ(troupe::kernels::cuda_runtime_queries(), before) << "validate asked the CUDA runtime for devices";
  EXPECT_FALSE(load_config_text(std::string(kMinimal) + "policy:\n  share_gpu: 2\n", "x.yaml", {}).ok());
}

// policy.device: cuda with an option the CUDA backend does not implement is an error at that
// option's line.
TEST(Config, CudaRejectsOptionsItDoesNotImplement) {
  auto m = load_error(std::string(kMinimal) + "policy:\n  device: cuda\n  batch_invariant: true\n");
  EXPECT_NE(m.find("x.yaml:5:"), std::string::npos) << m;
  EXPECT_NE(m.find("error: policy.batch_invariant: not implemented with policy.device: cuda"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "policy:\n  device: cuda\n  moe:\n    routing_replay: rollout\n");
  EXPECT_NE(m.find("error: policy.moe.routing_replay: not implemented with policy.device: cuda"), std::string::npos)
      << m;
  // bf16 GEMMs exist on cuda only: on cpu the key's line says so
  m = load_error(std::string(kMinimal) + "policy:\n  compute_dtype: bf16\n");
  EXPECT_NE(m.find("x.yaml:4:"), std::string::npos) << m;
  EXPECT_NE(m.find("error: policy.compute_dtype: bf16 GEMMs are implemented on policy.device: cuda only (got cpu)"),
            std::string::npos)
      << m;
  // weights by broadcast need a device backend
  m = load_error(std::string(kMinimal) + "weight_sync:\n  transport: nccl\n");
  EXPECT_NE(m.find("x.yaml:4:"), std::string::npos) << m;
  EXPECT_NE(m.find("error: weight_sync.transport: nccl broadcasts the weights between the members' devices: it needs "
                   "policy.device cuda (or cpu_fenced, in one process), got cpu"),
            std::string::npos)
      << m;
  m = load_error(std::string(kMinimal) + "weight_sync:\n  transport: mpi\n");
  EXPECT_NE(m.find("x.yaml:4:"), std::string::npos) << m;
}

TEST(Config, WrongType) {
  auto m = load_error(std::string(kMinimal) + "grpo:\n  max_steps: 1.5\n");
  EXPECT_NE(m.find("x.yaml:4:14: error: grpo.max_steps: expected an integer, got '1.5'"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "rollout:\n  async: maybe\n");
  EXPECT_NE(m.find("rollout.async: expected true or false, got 'maybe'"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "rollout:\n  temperature: \"hot\"\n");
  EXPECT_NE(m.find("rollout.temperature: expected a number"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "rollout: 3\n");
  EXPECT_NE(m.find("x.yaml:3:10: error: rollout: expected a mapping (a section), got '3'"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "policy:\n  model:\n    mlp_only_layers: [0, x]\n");
  EXPECT_NE(m.find("policy.model.mlp_only_layers[1]: expected an integer, got 'x'"), std::string::npos) << m;
  m = load_error("envs: arithmetic\n");
  EXPECT_NE(m.find("x.yaml:1:7: error: envs: expected a list"), std::string::npos) << m;
  // enum keys: the value and the choices, at the value's line
  m = load_error(std::string(kMinimal) + "loss:\n  kl_type: k4\n");
  EXPECT_NE(m.find("x.yaml:4:12: error: loss.kl_type: 'k4' is not one of: k1, k2, k3"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "loss:\n  agg_mode: seq-mean-token-sum\n");
  EXPECT_NE(m.find("x.yaml:4:13: error: loss.agg_mode: 'seq-mean-token-sum' is not one of: token-mean, "
                   "seq-mean-token-mean, seq-mean-token-sum-norm"),
            std::string::npos)
      << m;
  m = load_error(kMinimal, {"grpo.adv_estimator=reinforce_plus_plus"});
  EXPECT_NE(m.find("grpo.adv_estimator: 'reinforce_plus_plus' is not one of: grpo, rloo, reinforce_pp"), std::string::npos) << m;
}

TEST(Config, OutOfRange) {
  auto m = load_error(std::string(kMinimal) + "rollout:\n  top_p: 2\n");
  EXPECT_NE(m.find("x.yaml:4:10: error: rollout.top_p: value 2 is outside the documented range"), std::string::npos)
      << m;
  m = load_error(std::string(kMinimal) + "rollout:\n  num_generations: 0\n");
  EXPECT_NE(m.find("rollout.num_generations: value 0 is outside the documented range 1 .. 4096"), std::string::npos)
      << m;
  m = load_error(std::string(kMinimal) + "rollout:\n  template: chatt\n");
  EXPECT_NE(m.find("rollout.template: 'chatt' is not one of: plain, chat; did you mean 'chat'?"), std::string::npos)
      << m;
}

TEST(Config, EveryNumericKeyHasARange) {
  for (const auto& k : config_schema()) {
    if (k.type == KeyType::integer || k.type == KeyType::number || k.type == KeyType::int_list) {
      EXPECT_TRUE(k.min && k.max) << k.path;
    }
  }
  for (const auto& k : env_entry_schema()) {
    if (k.type == KeyType::integer || k.type == KeyType::number) {
      EXPECT_TRUE(k.min && k.max) << k.path;
    }
  }
}

TEST(Config, InFlightUpdatesNeedAsyncSingleTurnUnstreamed) {
  auto m = load_error(std::string(kMinimal) + "rollout:\n  in_flight_updates: true\n");
  EXPECT_NE(m.find("x.yaml:4:3: error: rollout.in_flight_updates: needs rollout.async: true"), std::string::npos) << m;
  const std::string async = std::string(kMinimal) + "rollout:\n  async: true\n  in_flight_updates: true\n";
  m = load_error(async + "  max_staleness: 0\n");
  EXPECT_NE(m.find("needs rollout.max_staleness >= 1"), std::string::npos) << m;
  m = load_error(async + "  async_chunks: 2\n");
  EXPECT_NE(m.find("needs rollout.async_chunks: 1"), std::string::npos) << m;
  m = load_error(async + "  max_turns: 2\n");
  EXPECT_NE(m.find("needs rollout.max_turns: 1"), std::string::npos) << m;
  m = load_error(async + "  serve: 127.0.0.1:0\n");
  EXPECT_NE(m.find("needs no rollout.serve"), std::string::npos) << m;
  m = load_error(async + "  max_staleness: 2\n  in_flight_min_lag: 3\n");
  EXPECT_NE(m.find("rollout.in_flight_min_lag: 3 is more than rollout.max_staleness (2)"), std::string::npos) << m;
  m = load_error(async + "  in_flight_every: 0\n");
  EXPECT_NE(m.find("rollout.in_flight_every"), std::string::npos) << m;
  EXPECT_TRUE(load_config_text(async + "  in_flight_every: 4\n", "x.yaml", {}).ok());
}

TEST(Config, LearnerShard) {
  for (const char* stage : {"none", "optimizer", "gradients", "parameters"}) {
    auto r = load_config_text(std::string(kMinimal) + "learner:\n  shard: " + stage + "\n", "x.yaml", {});
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(troupe::enum_string(r->config.learner.shard), stage);
  }
  auto m = load_error(std::string(kMinimal) + "learner:\n  shard: zero2\n");
  EXPECT_NE(m.find("learner.shard"), std::string::npos) << m;
  EXPECT_NE(m.find("gradients"), std::string::npos) << m;
}

TEST(Config, LearnerOptimizerOffload) {
  auto r = load_config_text(std::string(kMinimal) + "learner:\n  optimizer_offload: true\npolicy:\n  device: cpu_fenced\n",
                            "x.yaml", {});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->config.learner.optimizer_offload);
  r = load_config_text(std::string(kMinimal), "x.yaml", {});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->config.learner.optimizer_offload);
  auto m = load_error(std::string(kMinimal) + "learner:\n  optimizer_offload: true\n");
  EXPECT_NE(m.find("x.yaml:4:3: error: learner.optimizer_offload: true needs a model on a device"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "learner:\n  optimizer_offload: maybe\n");
  EXPECT_NE(m.find("learner.optimizer_offload"), std::string::npos) << m;
}

TEST(Config, AsyncChunksNeedsOneUpdateFromGroupLocalParts) {
  auto m = load_error(std::string(kMinimal) + "rollout:\n  async_chunks: 4\n");
  EXPECT_NE(m.find("x.yaml:4:3: error: rollout.async_chunks: 4 parts per step need rollout.async: true"),
            std::string::npos)
      << m;
  const std::string async = std::string(kMinimal) + "rollout:\n  async: true\n  async_chunks: 4\n";
  m = load_error(async + "grpo:\n  num_iterations: 2\n");
  EXPECT_NE(m.find("need grpo.num_iterations: 1 (got 2"), std::string::npos) << m;
  m = load_error(async + "grpo:\n  scale_rewards: batch\n");
  EXPECT_NE(m.find("advantages computed within each group"), std::string::npos) << m;
  m = load_error(async + "grpo:\n  dynamic_sampling: true\n");
  EXPECT_NE(m.find("need grpo.dynamic_sampling: false"), std::string::npos) << m;
  m = load_error(async + "  max_turns: 2\n");
  EXPECT_NE(m.find("need rollout.max_turns: 1"), std::string::npos) << m;
  m = load_error(async + "  prompts_per_step: 2\n");
  EXPECT_NE(m.find("need at least as many prompts per step (rollout.prompts_per_step = 2)"),
            std::string::npos)
      << m;
  m = load_error(async + "  async_chunkz: 2\n");
  EXPECT_NE(m.find("did you mean 'rollout.async_chunks'"), std::string::npos) << m;
  EXPECT_TRUE(load_config_text(async, "x.yaml", {}).ok());
}

TEST(Config, ImpossiblePlacement) {
  auto m = load_error(std::string(kMinimal) +
                      "rollout:\n  prompts_per_step: 1\n  num_generations: 2\ncluster:\n  learners: 3\n");
  EXPECT_NE(m.find("x.yaml:7:3: error: cluster.learners: impossible placement: 3 learners but only 2 trajectories"),
            std::string::npos)
      << m;
  m = load_error(std::string(kMinimal) + "rollout:\n  prompts_per_step: 2\ncluster:\n  generators: 3\n");
  EXPECT_NE(m.find("cluster.generators: impossible placement"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "policy:\n  model:\n    num_attention_heads: 4\n    num_key_value_heads: 3\n");
  EXPECT_NE(m.find("x.yaml:6:5: error: policy.model.num_key_value_heads: 3 does not divide"), std::string::npos) << m;
  m = load_error("envs:\n  - name: p\n    type: plugin\n");
  EXPECT_NE(m.find("envs[0].path: a plugin env needs path"), std::string::npos) << m;
  m = load_error("run:\n  seed: 1\n");
  EXPECT_NE(m.find("envs: at least one env is required"), std::string::npos) << m;
  m = load_error("envs:\n  - name: a\n  - name: a\n");
  EXPECT_NE(m.find("x.yaml:3:5: error: envs[1].name: env name 'a' is used twice"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "cluster:\n  curve: true\n");
  EXPECT_NE(m.find("x.yaml:4:3: error: cluster.curve: CURVE secures tcp"), std::string::npos) << m;
  EXPECT_NE(m.find("error: cluster.curve_secret_key: cluster.curve needs this key file"), std::string::npos) << m;
  // a wildcard bind gives the other ranks no address to connect to
  m = load_error(std::string(kMinimal) + "cluster:\n  transport: tcp\n  bind_host: 0.0.0.0\n");
  EXPECT_NE(m.find("x.yaml:5:3: error: cluster.bind_host: '0.0.0.0' binds every interface"), std::string::npos) << m;
  m = load_error(std::string(kMinimal) + "cluster:\n  transport: tcp\n", {"cluster.bind_host='*'"});
  EXPECT_NE(m.find("cluster.bind_host: '*' binds every interface"), std::string::npos) << m;
  EXPECT_TRUE(load_config_text(std::string(kMinimal) + "cluster:\n  transport: tcp\n  bind_host: eth0\n", "x.yaml", {}).ok());
  // a learner killed mid-sync must be one of the learners
  m = load_error(std::string(kMinimal) + "faults:\n  learner_death_sync: 2\n  learner_death_rank: 1\n");
  EXPECT_NE(m.find("faults.learner_death_rank: there are only 1 learner ranks"), std::string::npos) << m;
}

// Frozen models need scorers to serve them, and a judge reaching one must run in troupe's process.
TEST(Config, ScorersServeTheTeacherAndLocalJudges) {
  auto m = load_error(std::string(kMinimal) + "distill:\n  teacher: /models/t\n");
  EXPECT_NE(m.find("x.yaml:4:3: error: distill.teacher: the teacher is served by the scorers: set cluster.scorers >= 1"),
            std::string::npos)
      << m;
  EXPECT_TRUE(load_config_text(std::string(kMinimal) + "distill:\n  teacher: /models/t\ncluster:\n  scorers: 2\n",
                               "x.yaml", {})
                  .ok());
  const std::string judged =
      "envs:\n  - name: graded\n    type: judge\n    config: {train: rows.jsonl, judge: {model: /models/j}}\n";
  m = load_error(judged);
  EXPECT_NE(m.find("envs[0].config.judge.model: a judge with a local model"), std::string::npos) << m;
  m = load_error(judged, {"cluster.scorers=1", "envs[0].isolate=true"});
  EXPECT_NE(m.find("envs[0].config.judge.model: a judge with a local model reaches the scorers from troupe's own process"),
            std::string::npos)
      << m;
  auto ok = load_config_text(judged, "x.yaml", {"cluster.scorers=1"});
  EXPECT_TRUE(ok.ok()) << (ok.ok() ? "" : ok.error().message);
  m = load_error(std::string(kMinimal) + "distill:\n  teacher: /t\n  kind: forward_kl\n", {"cluster.scorers=1"});
  EXPECT_NE(m.find("distill.kind"), std::string::npos) << m;
}

TEST(Config, SyntaxError) {
  auto m = load_error("envs: [1, 2\n");
  EXPECT_NE(m.find("x.yaml:"), std::string::npos) << m;
  EXPECT_NE(m.find("error: YAML syntax"), std::string::npos) << m;
  // text that is not UTF-8, in a key or a value, in the file or a --set: an error naming where
  // (the resolved config, written as UTF-8, could not hold it; it used to abort the run)
  m = load_error("envs:\n  - name: arithmetic\n    config: {digi\x84ts: 3}\n");
  EXPECT_NE(m.find("x.yaml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("envs[0].config.digi"), std::string::npos) << m;
  EXPECT_NE(m.find("not valid UTF-8 text (byte 0x84 at offset 4"), std::string::npos) << m;
  m = load_error("run:\n  name: \"a\xED\xA0\x80" "b\"\n");  // a surrogate's bytes
  EXPECT_NE(m.find("run.name: not valid UTF-8 text (byte 0xED at offset 1"), std::string::npos) << m;
  m = load_error(kMinimal, {"run.name=caf\xE9"});
  EXPECT_NE(m.find("run.name: not valid UTF-8 text (byte 0xE9 at offset 3"), std::string::npos) << m;
  auto utf8 = load_config_text(kMinimal, "x.yaml", {"run.name=caf\xC3\xA9 \xF0\x9F\x99\x82"});
  EXPECT_TRUE(utf8.ok()) << (utf8.ok() ? "" : utf8.error().message);
}

TEST(Config, SetOverrides) {
  auto r = load_config_text(kMinimal, "x.yaml",
                            {"rollout.temperature=0.25", "grpo.max_steps=3", "envs[0].weight=2.5",
                             "envs.0.config.difficulty=4", "envs[1].name=countdown", "rollout.stop=[\"\\n\"]",
                             "policy.model.mlp_only_layers=[0,1]"});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FLOAT_EQ(r->config.rollout.temperature, 0.25f);
  EXPECT_EQ(r->config.grpo.max_steps, 3);
  EXPECT_EQ(r->config.envs[0].weight, 2.5);
  EXPECT_EQ(r->config.envs[0].config["difficulty"], 4);
  ASSERT_EQ(r->config.envs.size(), 2u);
  EXPECT_EQ(r->config.envs[1].name, "countdown");
  EXPECT_EQ(r->config.rollout.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r->config.policy.model.mlp_only_layers, (std::vector<int>{0, 1}));
}

// A leading ~/ in policy.path and run.dir is $HOME (configs name the fetched GGUF under ~/.cache).
TEST(Config, TildeIsHome) {
  const char* home = std::getenv("HOME");
  ASSERT_NE(home, nullptr);
  auto r = load_config_text("run:\n  dir: ~/runs/x\npolicy:\n  path: ~/.cache/m.gguf\n" + std::string(kMinimal), "x.yaml");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->config.run.dir, std::string(home) + "/runs/x");
  EXPECT_EQ(r->config.policy.path, std::string(home) + "/.cache/m.gguf");
  auto s = load_config_text(kMinimal, "x.yaml", {"policy.path=~user/m", "run.dir=a~/b"});
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->config.policy.path, "~user/m");  // only ~/ is expanded
  EXPECT_EQ(s->config.run.dir, "a~/b");
}

TEST(Config, BadSet) {
  auto m = load_error(kMinimal, {"rollout.temprature=0.5"});
  EXPECT_NE(m.find("--set rollout.temprature=0.5: error: rollout.temprature: unknown key; did you mean "
                   "'rollout.temperature'?"),
            std::string::npos)
      << m;
  m = load_error(kMinimal, {"grpo.max_steps=ten"});
  EXPECT_NE(m.find("--set grpo.max_steps=ten: error: grpo.max_steps: expected an integer, got 'ten'"),
            std::string::npos)
      << m;
  m = load_error(kMinimal, {"rollout.top_p=5"});
  EXPECT_NE(m.find("--set rollout.top_p=5: error: rollout.top_p: value 5 is outside"), std::string::npos) << m;
  m = load_error(kMinimal, {"grpo.max_steps"});
  EXPECT_NE(m.find("expected --set key.path=value"), std::string::npos) << m;
  m = load_error(kMinimal, {"envs[5].weight=1"});
  EXPECT_NE(m.find("there are only 1 envs"), std::string::npos) << m;
}

// A --resume may change where, how long and how the run is placed, logged, evaluated and
// checkpointed; any other difference from the run's config is a conflict naming the key.
TEST(Config, ResumeConflicts) {
  auto a = load_config_text(kMinimal, "x.yaml");
  ASSERT_TRUE(a.ok()) << a.error().message;
  auto same = load_config_text(kMinimal, "x.yaml",
                               {"grpo.max_steps=77", "cluster.threads=1", "logger.progress=plain", "eval.every=3",
                                "checkpointing.keep_last=5", "run.dir=/elsewhere", "policy.moe_grouped=false"});
  ASSERT_TRUE(same.ok()) << same.error().message;
  EXPECT_TRUE(resume_conflicts(a->config, same->config).empty());
  auto changed =
      load_config_text(kMinimal, "x.yaml", {"loss.kl_coef=0.1", "run.seed=9", "envs[0].weight=2", "sft.max_steps=7"});
  ASSERT_TRUE(changed.ok()) << changed.error().message;
  auto d = resume_conflicts(a->config, changed->config);
  std::vector<std::string> keys;
  for (const auto& c : d) keys.push_back(c.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"run.seed", "sft.max_steps", "loss.kl_coef", "envs[0].weight"}));
  EXPECT_EQ(d[2].before, "0.0");
  EXPECT_EQ(d[2].now, "0.1");
  EXPECT_NE(resume_may_change_summary().find("grpo.max_steps"), std::string::npos);
}

TEST(Config, ResolvedRoundTrip) {
  auto r = load_config_text(
      "rollout:\n  temperature: 0.7\n  stop: [\"\\n\", \"a\\\"b\"]\n  system_prompt: \"Solve: \"\n"
      "envs:\n  - name: arithmetic\n    config: {difficulty: 2}\n  - name: cd\n    env: countdown\n    weight: 0.5\n",
      "x.yaml");
  ASSERT_TRUE(r.ok()) << r.error().message;
  std::string y = resolved_yaml(r->config);
  auto back = load_config_text(y, "config.resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.error().message << "\n" << y;
  EXPECT_EQ(resolved_yaml(back->config), y);
  EXPECT_EQ(back->config.rollout.stop, r->config.rollout.stop);
  EXPECT_EQ(back->config.envs[0].config, r->config.envs[0].config);
  EXPECT_FLOAT_EQ(back->config.rollout.temperature, 0.7f);
  // enum keys write the learner's fields and read back by name
  auto e = load_config_text(std::string(kMinimal) + "loss:\n  kl_type: k1\n  agg_mode: seq-mean-token-mean\n"
                            "grpo:\n  adv_estimator: rloo\n  scale_rewards: none\noptimizer: {schedule: cosine}\n",
                            "x.yaml");
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->config.loss.kl_type, troupe::learner::KlEstimator::k1);
  EXPECT_EQ(e->config.loss.agg_mode, troupe::learner::LossAggMode::seq_mean_token_mean);
  EXPECT_EQ(e->config.grpo.adv_estimator, troupe::learner::AdvantageEstimator::rloo);
  EXPECT_EQ(e->config.grpo.scale_rewards, troupe::learner::StdMode::none);
  EXPECT_EQ(e->config.optimizer.schedule, troupe::learner::LrSchedule::cosine);
  const std::string ye = resolved_yaml(e->config);
  EXPECT_NE(ye.find("  kl_type: \"k1\"\n"), std::string::npos) << ye;
  auto eback = load_config_text(ye, "config.resolved.yaml");
  ASSERT_TRUE(eback.ok()) << eback.error().message << "\n" << ye;
  EXPECT_EQ(resolved_yaml(eback->config), ye);
}

TEST(Config, Readme) {
  std::string path = std::string(TROUPE_SOURCE_DIR) + "/configs/README.md";
  std::string want = render_config_readme();
  const char* update = std::getenv("TROUPE_UPDATE_README");
  if (update && std::string(update) == "1") {
    std::ofstream(path) << want;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string have = ss.str();
  // Every key appears with its default.
  troupe::actors::ExperimentConfig d;
  for (const auto& k : config_schema()) {
    if (k.path == "envs") continue;
    std::string cell = "| `" + k.path + "` | " + type_name(k.type) + " | `" + render_value(k.field(d)) + "` |";
    EXPECT_NE(have.find(cell), std::string::npos) << "configs/README.md lacks " << cell;
  }
  EXPECT_EQ(have, want) << "configs/README.md is out of date: regenerate it with "
                           "TROUPE_UPDATE_README=1 ctest -R launch.config_readme";
}

namespace {

// The names ctest knows (`policy.model`, `envs.arithmetic`, ...): dotted like YAML keys, but not keys.
std::set<std::string> ctest_names() {
  std::set<std::string> out;
  const char* ctest = std::getenv("TROUPE_CTEST");
  std::string cmd = std::string("'") + (ctest && *ctest ? ctest : "ctest") + "' --test-dir '" + TROUPE_BINARY_DIR +
                    "' -N 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  static const std::regex line(R"(^\s*Test\s+#\d+:\s+(\S+))");
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    std::cmatch m;
    if (std::regex_search(buf, m, line)) out.insert(m[1].str());
  }
  pclose(p);
  return out;
}

}  // namespace

// Every `section.key[.sub]` in backticks (section = a top-level section of configs/README.md) in a
// README.md anywhere in the repository or in docs/*.md is a key of configs/README.md, a section or a
// `prefix.*` of its keys. Not keys: file names (`run.cpp`), ctest names (`policy.golden`).
TEST(Config, DocsYamlKeys) {
  namespace fs = std::filesystem;
  const fs::path root = TROUPE_SOURCE_DIR;
  // configs/README.md: "## `section`" headings, then tables whose first cell is the key
  std::set<std::string> sections, keys;
  {
    std::ifstream in(root / "configs/README.md");
    ASSERT_TRUE(in) << "cannot read configs/README.md";
    static const std::regex heading(R"(^## `([a-z_]+)`)"), row(R"(^\| `([^`]+)` \|)");
    bool in_section = false;
    for (std::string l; std::getline(in, l);) {
      std::smatch m;
      if (std::regex_search(l, m, heading)) {
        sections.insert(m[1].str());
        in_section = true;
      } else if (l.rfind("## ", 0) == 0) {
        in_section = false;
      } else if (in_section && std::regex_search(l, m, row)) {
        keys.insert(m[1].str());
      }
    }
  }
  ASSERT_TRUE(sections.count("loss") && keys.count("loss.kl_coef") && keys.count("envs[].weight"));
  const std::set<std::string> tests = ctest_names();
  auto is_test = [&](const std::string& t) {
    if (tests.count(t)) return true;
    if (t.size() > 2 && t.compare(t.size() - 2, 2, ".*") == 0)
      for (const auto& n : tests)
        if (n.rfind(t.substr(0, t.size() - 1), 0) == 0) return true;
    return false;
  };
  auto known = [&](const std::string& key) {
    if (keys.count(key) || key.rfind("envs[].config.", 0) == 0) return true;
    std::string prefix = key;
    if (prefix.size() > 2 && prefix.compare(prefix.size() - 2, 2, ".*") == 0) prefix.resize(prefix.size() - 2);
    for (const auto& k : keys)  // a section (policy.model) or a wildcard (cluster.*)
      if (k.rfind(prefix + ".", 0) == 0) return true;
    return false;
  };
  static const std::set<std::string> file_ext = {"h",  "cpp", "md",   "yaml", "yml", "py",          "json", "jsonl",
                                                 "so", "txt", "cmake", "sh",  "toml", "safetensors", "in",   "cu"};
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name.rfind(".", 0) == 0 || name.rfind("build", 0) == 0 || name == "runs" ||
                               name == "__pycache__" || name == "node_modules")) {
      it.disable_recursion_pending();
      continue;
    }
    const bool doc = it->path().parent_path() == root / "docs" && it->path().extension() == ".md";
    if (it->is_regular_file() && (name == "README.md" || doc)) files.push_back(it->path());
  }
  ASSERT_FALSE(files.empty());
  // a dotted name not glued to a path or a longer name; envs[0].weight is written envs[].weight
  static const std::regex token(R"((?:^|[^\w./\[\]-])([a-z_]+(?:\[\d*\])?(?:\.[\w*]+(?:\[\d*\])?)+))");
  static const std::regex env_index(R"(^envs\[\d*\])");
  int checked = 0;
  for (const auto& f : files) {
    std::ifstream in(f);
    bool fence = false;
    int n = 0;
    for (std::string l; std::getline(in, l);) {
      ++n;
      if (l.find("```") != std::string::npos) {
        fence = !fence;
        continue;
      }
      if (fence) continue;
      std::stringstream parts(l);
      std::string span;
      for (int i = 0; std::getline(parts, span, '`'); ++i) {
        if (i % 2 == 0) continue;  // outside backticks
        for (std::sregex_iterator m(span.begin(), span.end(), token), end; m != end; ++m) {
          std::string t = (*m)[1].str();
          while (!t.empty() && t.back() == '.') t.pop_back();
          const std::string first = t.substr(0, t.find_first_of(".["));
          const std::string last = t.substr(t.rfind('.') + 1);
          if (!sections.count(first) || file_ext.count(last) || is_test(t)) continue;
          const std::string key = std::regex_replace(t, env_index, "envs[]");
          ++checked;
          EXPECT_TRUE(known(key)) << fs::relative(f, root).string() << ":" << n << ": `" << t
                                  << "` is not a key of configs/README.md";
        }
      }
    }
  }
  EXPECT_GT(checked, 100);  // configs/README.md alone names every key
}

namespace {

// How the model runs lives under policy.* and applies to loaded models too; the old
// policy.model.<option> spellings still load, each with a warning naming the new key; with
// policy.path, an architecture key (policy.model.*) is an error, never silently dropped.
TEST(Config, ExecutionOptionsUnderPolicy) {
  auto a = load_config_text(std::string(kMinimal) + "policy:\n  moe_grouped: false\n  activation_checkpointing: true\n",
                            "x.yaml");
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_FALSE(a->config.policy.moe_grouped);
  EXPECT_TRUE(a->config.policy.activation_checkpointing);
  EXPECT_TRUE(a->warnings.empty());

  auto old = load_config_text(std::string(kMinimal) + "policy:\n  model:\n    moe_grouped: false\n", "x.yaml",
                              {"policy.model.cache_packed_metadata=false"});
  ASSERT_TRUE(old.ok()) << old.error().message;
  EXPECT_FALSE(old->config.policy.moe_grouped);
  EXPECT_FALSE(old->config.policy.cache_packed_metadata);
  ASSERT_EQ(old->warnings.size(), 2u);
  EXPECT_NE(old->warnings[0].find("x.yaml:5:5: warning: policy.model.moe_grouped is deprecated; use policy.moe_grouped"),
            std::string::npos)
      << old->warnings[0];
  EXPECT_NE(old->warnings[1].find("policy.model.cache_packed_metadata is deprecated; use policy.cache_packed_metadata"),
            std::string::npos)
      << old->warnings[1];

  auto m = load_error(std::string(kMinimal) + "policy:\n  path: /models/x\n  model:\n    hidden_size: 64\n");
  EXPECT_NE(m.find("x.yaml:6:5: error: policy.model.hidden_size: policy.path is set, so the architecture comes from its "
                   "config.json"),
            std::string::npos)
      << m;
  auto many = load_error(std::string(kMinimal) + "policy:\n  path: /models/x\n  model:\n    hidden_size: 64\n    head_dim: 16\n");
  EXPECT_NE(many.find("remove the policy.model section (hidden_size, head_dim)"), std::string::npos) << many;
  EXPECT_EQ(many.find("policy.model.head_dim:"), std::string::npos) << "one error for the whole section: " << many;
  auto loaded = load_config_text(std::string(kMinimal) + "policy:\n  path: /models/x\n  moe_grouped: false\n", "x.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  // The resolved config of a loaded model leaves policy.model out, so it loads back (--resume).
  const std::string resolved = resolved_yaml(loaded->config);
  EXPECT_EQ(resolved.find("hidden_size"), std::string::npos);
  auto back = load_config_text(resolved, "config.resolved.yaml");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_FALSE(back->config.policy.moe_grouped);
}

}  // namespace

// policy.base_dtype (QLoRA): a quantized base needs LoRA, gguf a .gguf policy.path, q4_k widths that
// are multiples of 256; an unknown name is an error naming the key.
TEST(Config, BaseDtype) {
  const std::string lora = "  lora:\n    rank: 4\n    targets: [q, k, v, o]\n";
  auto ok = load_config_text(std::string(kMinimal) + "policy:\n  base_dtype: q8_0\n" + lora, "x.yaml");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->config.policy.base_dtype, troupe::policy::BaseDtype::q8_0);
  auto full = load_error(std::string(kMinimal) + "policy:\n  base_dtype: q8_0\n");
  EXPECT_NE(full.find("x.yaml:4:"), std::string::npos) << full;
  EXPECT_NE(full.find("error: policy.base_dtype: q8_0 holds a frozen, quantized base, but policy.lora.rank is 0"),
            std::string::npos)
      << full;
  auto unknown = load_error(std::string(kMinimal) + "policy:\n  base_dtype: q3_x\n" + lora);
  EXPECT_NE(unknown.find("policy.base_dtype"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("q3_x"), std::string::npos) << unknown;
  auto gguf = load_error(std::string(kMinimal) + "policy:\n  base_dtype: gguf\n" + lora);
  EXPECT_NE(gguf.find("error: policy.base_dtype: gguf keeps the blocks of a .gguf policy.path, but policy.path is empty"),
            std::string::npos)
      << gguf;
  auto q4k = load_error(std::string(kMinimal) + "policy:\n  base_dtype: q4_k\n" + lora);
  EXPECT_NE(q4k.find("error: policy.base_dtype: q4_k blocks hold 256 values of a weight row, but policy.model.hidden_size is 128"),
            std::string::npos)
      << q4k;
}

// A verifiers env calls the policy over HTTP: it needs rollout.serve (a loopback HOST:PORT), its
// server's address, and single-turn rollouts (its server runs the turns); each is exit 2 naming it.
TEST(Config, VerifiersEnvNeedsRolloutServe) {
  const std::string vf = "envs:\n  - name: vf\n    type: verifiers\n    address: tcp://127.0.0.1:5000\n";
  auto ok = load_config_text(vf + "rollout:\n  serve: 127.0.0.1:0\n", "x.yaml");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->config.rollout.serve, "127.0.0.1:0");
  EXPECT_NE(load_error(vf).find("rollout.serve"), std::string::npos);
  EXPECT_NE(load_error("envs:\n  - name: vf\n    type: verifiers\nrollout:\n  serve: 127.0.0.1:0\n").find("address"),
            std::string::npos);
  EXPECT_NE(load_error(vf + "rollout:\n  serve: 127.0.0.1:0\n  max_turns: 3\n").find("rollout.max_turns"),
            std::string::npos);
  for (const char* bad : {"8000", "127.0.0.1:http", "0.0.0.0:8000", "127.0.0.1:70000"}) {
    const std::string e = load_error(std::string(kMinimal) + "rollout:\n  serve: \"" + bad + "\"\n");
    EXPECT_NE(e.find("rollout.serve"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("x.yaml:"), std::string::npos) << e;
  }
}
