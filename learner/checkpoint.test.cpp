// Checkpoints: round trip, latest/best symlinks, keep-last-K, corrupt/missing/mis-shaped files give
// errors naming the file, and resume is bit-identical (2N steps == N steps + save/load + N steps).
#include "troupe/learner/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "troupe/learner/trainer.h"

using namespace troupe::learner;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("troupe_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

std::vector<Sample> batch_for_step(int step, int V) {
  std::mt19937_64 rng(1000 + step);
  std::uniform_int_distribution<int> tok(0, V - 1), len(1, 6);
  std::normal_distribution<float> nd(0, 1);
  std::vector<Sample> out(8);
  for (auto& s : out) {
    for (int i = len(rng); i > 0; --i) s.prompt.push_back(tok(rng));
    for (int i = len(rng); i > 0; --i) {
      s.completion.push_back(tok(rng));
      s.old_logprobs.push_back(-2.0f + 0.2f * nd(rng));
    }
    s.advantage = nd(rng);
  }
  return out;
}

LearnerConfig config() {
  LearnerConfig c;
  c.optimizer.lr = 1e-2f;
  c.optimizer.weight_decay = 0.01f;
  c.optimizer.schedule = LrSchedule::cosine;
  c.optimizer.warmup_steps = 2;
  c.optimizer.total_steps = 40;
  c.batch.num_mini_batches = 2;
  c.batch.num_iterations = 2;
  c.batch.shuffle = true;  // exercises the trainer RNG that the checkpoint must restore
  c.seed = 5;
  return c;
}

troupe::Result<std::string> save(Trainer& tr, BigramModel& model, const fs::path& dir, int64_t step, CheckpointOptions o = {},
                         std::optional<double> metric = std::nullopt) {
  CheckpointData d;
  d.step = step;
  d.policy_version = step + 100;
  d.trainer_state = tr.state_json();
  d.extra = {{"data_cursor", step * 8}};
  d.metric = metric;
  return save_checkpoint(dir.string(), d, flat_model_writer(model.params(), model.tensors(), {{"vocab_size", 12}}),
                         tr.optimizer(), model.tensors(), o);
}

void flip_byte(const fs::path& p, size_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

}  // namespace

TEST(Checkpoint, ResumeIsBitIdentical) {
  const int N = 3;
  const fs::path dir = fresh_dir("resume");
  LocalCommunicator comm;
  BigramModel straight(12, 9);
  {
    Trainer tr(straight, config(), comm);
    for (int s = 0; s < 2 * N; ++s) ASSERT_TRUE(tr.train_step(batch_for_step(s, 12)).ok());
  }
  BigramModel first(12, 9);
  {
    Trainer tr(first, config(), comm);
    for (int s = 0; s < N; ++s) ASSERT_TRUE(tr.train_step(batch_for_step(s, 12)).ok());
    ASSERT_TRUE(save(tr, first, dir, N).ok());
  }
  BigramModel resumed(12, 123);  // different init: everything must come from the checkpoint
  Trainer tr(resumed, config(), comm);
  auto latest = latest_checkpoint(dir.string());
  ASSERT_TRUE(latest.ok()) << latest.error().message;
  auto data = load_checkpoint(*latest, resumed.tensors(), tr.optimizer());
  ASSERT_TRUE(data.ok()) << data.error().message;
  ASSERT_TRUE(read_flat_model(*latest, resumed.tensors(), resumed.params()).ok());
  ASSERT_TRUE(tr.load_state_json(data->trainer_state).ok());
  EXPECT_EQ(data->step, N);
  EXPECT_EQ(data->policy_version, N + 100);
  EXPECT_EQ(data->extra["data_cursor"], N * 8);
  for (int s = N; s < 2 * N; ++s) ASSERT_TRUE(tr.train_step(batch_for_step(s, 12)).ok());
  for (size_t i = 0; i < straight.params().size(); ++i)
    ASSERT_EQ(straight.params()[i], resumed.params()[i]) << "param " << i << " differs after resume";
  fs::remove_all(dir);
}

TEST(Checkpoint, AShareOfTheMomentsIsTheirSlice) {
  // a sharded learner's resume reads only [begin, end) of the moments: the same bits as that slice
  // of the whole load, whatever tensors the range cuts
  const fs::path dir = fresh_dir("share");
  LocalCommunicator comm;
  BigramModel model(12, 9);
  Trainer tr(model, config(), comm);
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(tr.train_step(batch_for_step(s, 12)).ok());
  auto saved = save(tr, model, dir, 3);
  ASSERT_TRUE(saved.ok()) << saved.error().message;
  AdamW whole;
  ASSERT_TRUE(load_checkpoint(*saved, model.tensors(), whole).ok());
  const size_t n = whole.size();
  ASSERT_GT(n, 20u);
  for (auto [b, e] : {std::pair<size_t, size_t>{0, 7}, {5, n - 3}, {n / 2, n}}) {
    AdamW share(e - b);
    auto d = load_checkpoint_share(*saved, model.tensors(), b, n, share);
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_EQ(d->step, 3);
    EXPECT_EQ(share.steps(), whole.steps());
    for (size_t i = b; i < e; ++i) {
      ASSERT_EQ(share.exp_avg()[i - b], whole.exp_avg()[i]) << i;
      ASSERT_EQ(share.exp_avg_sq()[i - b], whole.exp_avg_sq()[i]) << i;
    }
  }
  AdamW past(8);  // a share past the buffer's end is refused
  auto r = load_checkpoint_share(*saved, model.tensors(), n - 4, n, past);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("of a buffer of " + std::to_string(n)), std::string::npos) << r.error().message;
  fs::remove_all(dir);
}

TEST(Checkpoint, LatestKeepLastAndBest) {
  const fs::path dir = fresh_dir("keep");
  LocalCommunicator comm;
  BigramModel model(12, 1);
  Trainer tr(model, config(), comm);
  CheckpointOptions o;
  o.keep_last = 2;
  o.best_metric = "eval_accuracy";
  const double metrics[] = {0.2, 0.9, 0.5, 0.4, 0.7};
  for (int s = 1; s <= 5; ++s) ASSERT_TRUE(save(tr, model, dir, s * 10, o, metrics[s - 1]).ok());
  EXPECT_EQ(fs::read_symlink(dir / "latest").string(), "step_50");
  EXPECT_EQ(fs::read_symlink(dir / "best").string(), "step_20");
  EXPECT_TRUE(fs::exists(dir / "step_50") && fs::exists(dir / "step_40") && fs::exists(dir / "step_20"));
  EXPECT_FALSE(fs::exists(dir / "step_10") || fs::exists(dir / "step_30"));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
  EXPECT_TRUE(fs::exists(dir / "step_50" / "config.json"));
  EXPECT_TRUE(fs::exists(dir / "step_50" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "step_50" / "optimizer.safetensors"));
  // saving the same step again replaces it
  ASSERT_TRUE(save(tr, model, dir, 50, o, 0.1).ok());
  AdamW opt(model.params().size());
  EXPECT_TRUE(load_checkpoint((dir / "step_50").string(), model.tensors(), opt).ok());
  fs::remove_all(dir);
}

TEST(Checkpoint, CorruptFilesAreNamed) {
  const fs::path dir = fresh_dir("corrupt");
  LocalCommunicator comm;
  BigramModel model(12, 1);
  Trainer tr(model, config(), comm);
  ASSERT_TRUE(tr.train_step(batch_for_step(0, 12)).ok());
  auto saved = save(tr, model, dir, 1);
  ASSERT_TRUE(saved.ok());
  const fs::path step(*saved);
  AdamW opt(model.params().size());

  flip_byte(step / "optimizer.safetensors", fs::file_size(step / "optimizer.safetensors") - 3);
  auto r = load_checkpoint(step.string(), model.tensors(), opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("optimizer.safetensors fails its checksum"), std::string::npos) << r.error().message;
  // verify_checkpoint (what the launcher runs before a --resume writes anything) says the same
  auto v = verify_checkpoint(step.string());
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().message, r.error().message);
  flip_byte(step / "optimizer.safetensors", fs::file_size(step / "optimizer.safetensors") - 3);  // undo
  EXPECT_TRUE(load_checkpoint(step.string(), model.tensors(), opt).ok());
  v = verify_checkpoint(step.string());
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ((*v)["step"].get<int64_t>(), 1);

  // Several readers sharing the checksum reads (a job's ranks, verify_checkpoint_part): exactly the one
  // that reads the corrupt file fails, naming it, and together they pass a whole checkpoint.
  for (int parts : {1, 2, 3, 5}) {
    int passed = 0;
    for (int p = 0; p < parts; ++p) passed += verify_checkpoint_part(step.string(), p, parts).ok();
    EXPECT_EQ(passed, parts) << parts << " parts";
  }
  flip_byte(step / "optimizer.safetensors", fs::file_size(step / "optimizer.safetensors") - 3);
  for (int parts : {1, 2, 3, 5}) {
    int failed = 0;
    for (int p = 0; p < parts; ++p) {
      auto part = verify_checkpoint_part(step.string(), p, parts);
      if (part.ok()) continue;
      ++failed;
      EXPECT_NE(part.error().message.find("optimizer.safetensors fails its checksum"), std::string::npos)
          << part.error().message;
    }
    EXPECT_EQ(failed, 1) << parts << " parts";
  }
  flip_byte(step / "optimizer.safetensors", fs::file_size(step / "optimizer.safetensors") - 3);  // undo
  EXPECT_FALSE(verify_checkpoint_part(step.string(), 2, 2).ok());  // (no such part)

  fs::resize_file(step / "model.safetensors", fs::file_size(step / "model.safetensors") - 4);
  r = load_checkpoint(step.string(), model.tensors(), opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("model.safetensors has"), std::string::npos) << r.error().message;

  fs::remove(step / "model.safetensors");
  r = load_checkpoint(step.string(), model.tensors(), opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("model.safetensors is missing"), std::string::npos) << r.error().message;

  { std::ofstream(step / "state.json") << "{ not json"; }
  r = load_checkpoint(step.string(), model.tensors(), opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("state.json is not a JSON object"), std::string::npos) << r.error().message;
  fs::remove_all(dir);
}

// What a kill -9 in the middle of a save leaves (a temporary step directory, a step moved aside, a
// link half-swapped) is removed by the next save and never taken for a checkpoint; a state.json
// that does not list the weights and moments, lists a file outside the step or a directory, is
// refused with the file named (never an exception).
TEST(Checkpoint, KilledSaveLeftoversAndPartialState) {
  const fs::path dir = fresh_dir("leftovers");
  LocalCommunicator comm;
  BigramModel model(12, 1);
  Trainer tr(model, config(), comm);
  ASSERT_TRUE(save(tr, model, dir, 1).ok());
  for (const char* left : {".tmp_step_2.999", ".old_step_1.999", ".removing_step_0.999"}) {
    fs::create_directories(dir / left);
    std::ofstream(dir / left / "model.safetensors") << "half";
  }
  fs::create_directory_symlink("step_1", dir / ".latest.tmp.999");
  EXPECT_EQ(checkpoint_steps(dir.string()).size(), 1u);
  CheckpointOptions o;
  o.keep_last = 1;
  ASSERT_TRUE(save(tr, model, dir, 2, o).ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_2"}));

  const fs::path step = dir / "step_2";
  std::ifstream in(step / "state.json");
  nlohmann::json state = nlohmann::json::parse(in);
  auto rewrite = [&](const nlohmann::json& j) { std::ofstream(step / "state.json") << j.dump(); };
  for (const char* required : {"model.safetensors", "optimizer.safetensors"}) {
    nlohmann::json partial = state;
    partial["files"].erase(required);
    rewrite(partial);
    auto v = verify_checkpoint(step.string());
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.error().message.find(std::string("does not list ") + required), std::string::npos) << v.error().message;
  }
  nlohmann::json outside = state;
  outside["files"]["../step_1/model.safetensors"] = state["files"]["model.safetensors"];
  rewrite(outside);
  auto v = verify_checkpoint(step.string());
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("not a relative path inside the checkpoint directory"), std::string::npos) << v.error().message;
  fs::create_directory(step / "sub");
  nlohmann::json a_dir = state;
  a_dir["files"]["sub"] = state["files"]["config.json"];
  rewrite(a_dir);
  v = verify_checkpoint(step.string());
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("sub (listed in"), std::string::npos) << v.error().message;
  rewrite(state);
  EXPECT_TRUE(verify_checkpoint(step.string()).ok());
  fs::remove_all(dir);
}

TEST(Checkpoint, ShapeMismatchNamesTensorAndFile) {
  const fs::path dir = fresh_dir("shape");
  LocalCommunicator comm;
  BigramModel model(12, 1);
  Trainer tr(model, config(), comm);
  auto saved = save(tr, model, dir, 1);
  ASSERT_TRUE(saved.ok());
  BigramModel other(10, 1);
  AdamW opt(other.params().size());
  auto r = load_checkpoint(*saved, other.tensors(), opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("embed_tokens"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("optimizer.safetensors"), std::string::npos) << r.error().message;
  auto m = read_flat_model(*saved, other.tensors(), other.params());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("model.safetensors"), std::string::npos) << m.error().message;
  EXPECT_FALSE(latest_checkpoint((dir / "nowhere").string()).ok());
  fs::remove_all(dir);
}

TEST(Checkpoint, Crc32KnownValue) {
  const char* s = "123456789";
  EXPECT_EQ(crc32_update(0, s, 9), 0xCBF43926u);  // the standard check value
}
