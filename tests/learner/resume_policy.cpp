// Resume of the real MoE policy model on CPU is bit-identical: 2N GRPO steps straight equal N steps,
// a checkpoint through policy::io::save_model + optimizer.safetensors + state.json, a fresh model
// loaded from it, then N more steps. Also: a corrupt model.safetensors is named on load, and LoRA
// with dropout trains the same bits twice and across a resume.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "troupe/learner/checkpoint.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/model.h"
#include "test_support.h"

using namespace troupe;
using namespace troupe::learner;
namespace fs = std::filesystem;

namespace {

policy::ModelConfig tiny() { return test::tiny_model(2, 4); }

std::vector<Sample> batch_for(int step) {
  std::mt19937_64 rng(500 + step);
  std::uniform_int_distribution<int> tok(0, 31), len(1, 6);
  std::normal_distribution<float> nd(0, 1);
  std::vector<Sample> out(6);
  for (auto& s : out) {
    for (int i = len(rng); i > 0; --i) s.prompt.push_back(tok(rng));
    for (int i = len(rng); i > 0; --i) s.completion.push_back(tok(rng));
    s.advantage = nd(rng);
  }
  return out;
}

LearnerConfig config() {
  LearnerConfig c;
  c.optimizer.lr = 3e-3f;
  c.optimizer.warmup_steps = 2;
  c.batch.num_mini_batches = 2;
  c.batch.num_iterations = 2;  // old log-probs recomputed
  c.batch.shuffle = true;
  c.batch.temperature = 0.9f;
  c.loss.clip_high = 0.28f;
  c.seed = 3;
  return c;
}

}  // namespace

TEST(ResumePolicyModel, BitIdentical) {
  const int N = 2;
  const fs::path dir = fs::temp_directory_path() / ("troupe_resume_policy_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  LocalCommunicator comm;
  auto straight = policy::Model::create(tiny(), 1);
  ASSERT_TRUE(straight.ok()) << straight.error().message;
  {
    ModelAdapter a(*straight);
    Trainer tr(a, config(), comm);
    for (int s = 0; s < 2 * N; ++s) ASSERT_TRUE(tr.train_step(batch_for(s)).ok());
  }
  auto first = policy::Model::create(tiny(), 1);
  ASSERT_TRUE(first.ok());
  {
    ModelAdapter a(*first);
    Trainer tr(a, config(), comm);
    for (int s = 0; s < N; ++s) ASSERT_TRUE(tr.train_step(batch_for(s)).ok());
    CheckpointData d;
    d.step = N;
    d.trainer_state = tr.state_json();
    auto saved = save_checkpoint(dir.string(), d, policy_model_writer(*first), tr.optimizer(), first->tensors(), {});
    ASSERT_TRUE(saved.ok()) << saved.error().message;
    EXPECT_TRUE(fs::exists(fs::path(*saved) / "config.json"));
  }
  auto resumed = policy::Model::create(tiny(), 99);
  ASSERT_TRUE(resumed.ok());
  ModelAdapter a(*resumed);
  Trainer tr(a, config(), comm);
  auto latest = latest_checkpoint(dir.string());
  ASSERT_TRUE(latest.ok());
  auto data = load_checkpoint(*latest, resumed->tensors(), tr.optimizer());
  ASSERT_TRUE(data.ok()) << data.error().message;
  auto st = load_policy_model_params(*latest, *resumed);
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_TRUE(tr.load_state_json(data->trainer_state).ok());
  for (int s = N; s < 2 * N; ++s) ASSERT_TRUE(tr.train_step(batch_for(s)).ok());
  const auto p1 = straight->params(), p2 = resumed->params();
  ASSERT_EQ(p1.size(), p2.size());
  for (size_t i = 0; i < p1.size(); ++i) ASSERT_EQ(p1[i], p2[i]) << "param " << i << " differs after resume";

  // a flipped byte in the model weights is caught by the checksum and named
  const fs::path weights = fs::path(*latest) / "model.safetensors";
  {
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(weights) - 2);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(at);
    f.write(&c, 1);
  }
  AdamW opt(resumed->params().size());
  auto bad = load_checkpoint(*latest, resumed->tensors(), opt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("model.safetensors fails its checksum"), std::string::npos) << bad.error().message;
  fs::remove_all(dir);
}

// LoRA with dropout: the masks come from (run seed, optimizer step, rank, micro-batch), so the
// same seed trains the same bits, and a resume (adapters, AdamW moments and the trainer's state
// carried over into a fresh model and trainer) continues bit for bit.
TEST(ResumePolicyModel, LoraDropoutBitIdentical) {
  policy::ModelConfig mc = tiny();
  mc.num_experts = 0;  // a dense model: adapters on every linear layer
  mc.lora.rank = 4;
  mc.lora.dropout = 0.25f;
  LocalCommunicator comm;
  const int N = 2;
  auto run = [&](int steps, policy::Model& m, Trainer& tr, int from) {
    for (int s = from; s < from + steps; ++s) ASSERT_TRUE(tr.train_step(batch_for(s)).ok());
    (void)m;
  };
  auto straight = policy::Model::create(mc, 1);
  ASSERT_TRUE(straight.ok()) << straight.error().message;
  ModelAdapter sa(*straight);
  Trainer st(sa, config(), comm);
  run(2 * N, *straight, st, 0);
  auto again = policy::Model::create(mc, 1);
  ASSERT_TRUE(again.ok());
  ModelAdapter aa(*again);
  Trainer at(aa, config(), comm);
  run(2 * N, *again, at, 0);
  ASSERT_TRUE(std::equal(straight->params().begin(), straight->params().end(), again->params().begin()));
  // dropout changes the update (the same run without it differs)
  policy::ModelConfig no_drop = mc;
  no_drop.lora.dropout = 0;
  auto plain = policy::Model::create(no_drop, 1);
  ASSERT_TRUE(plain.ok());
  ModelAdapter pa(*plain);
  Trainer pt(pa, config(), comm);
  run(2 * N, *plain, pt, 0);
  EXPECT_FALSE(std::equal(straight->params().begin(), straight->params().end(), plain->params().begin()));

  auto first = policy::Model::create(mc, 1);
  ASSERT_TRUE(first.ok());
  ModelAdapter fa(*first);
  Trainer ft(fa, config(), comm);
  run(N, *first, ft, 0);
  auto resumed = policy::Model::create(mc, 1);
  ASSERT_TRUE(resumed.ok());
  ModelAdapter ra(*resumed);
  Trainer rt(ra, config(), comm);
  ASSERT_TRUE(resumed->set_params(first->params()).ok());
  std::copy(ft.optimizer().exp_avg().begin(), ft.optimizer().exp_avg().end(), rt.optimizer().exp_avg().begin());
  std::copy(ft.optimizer().exp_avg_sq().begin(), ft.optimizer().exp_avg_sq().end(),
            rt.optimizer().exp_avg_sq().begin());
  rt.optimizer().set_steps(ft.optimizer().steps());
  ASSERT_TRUE(rt.load_state_json(ft.state_json()).ok());
  run(N, *resumed, rt, N);
  const auto p1 = straight->params(), p2 = resumed->params();
  ASSERT_EQ(p1.size(), p2.size());
  for (size_t i = 0; i < p1.size(); ++i) ASSERT_EQ(p1[i], p2[i]) << "adapter value " << i << " differs after resume";
}
