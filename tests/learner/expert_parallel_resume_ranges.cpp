// policy.expert_parallel_resume_own_ranges: a learner holding one block of experts
// (Model::create_expert_block, E = 2 and 4, every block) loads its part of a checkpoint of every
// layout troupe writes -- whole (model.safetensors + optimizer.safetensors), a sharded run's shards
// (3 files), divided experts' runs at E' = 2 and 4 -- through learner::load_checkpoint_ranges: its
// weights and both moments equal the whole model's values cut to its block (take_local, what a
// resume loaded before, read whole and cut, which the test also runs) bit for bit, and the bytes it read of the safetensors files
// (policy::io::safetensors_data_bytes_read) are exactly its own values' 3 x 4 bytes each. The other
// blocks' experts, overwritten with NaN in the whole checkpoint, still load right for the learners
// that do not hold them. Errors: a checkpoint of another model names the tensor, a truncated shard
// names its file and rank. A sharded (ZeRO) learner's share -- the moments alone, or with its shard of
// the weights -- loads from every layout reading exactly its values' bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "troupe/actors/weight_shards.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/learner/checkpoint_ranges.h"
#include "troupe/learner/expert_parallel.h"
#include "troupe/learner/sharded_checkpoint.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/safetensors.h"
#include "test_support.h"

using namespace troupe;
using namespace troupe::learner;
namespace fs = std::filesystem;

namespace {

policy::ModelConfig tiny_moe() {
  policy::ModelConfig mc = test::tiny_model(3, 4);  // MoE layers 0 and 2, 4 experts of (16, 16)
  mc.mlp_only_layers = {1};
  return mc;
}

struct Saved {
  policy::Model model;  // the whole model whose weights the checkpoints hold
  AdamW moments;        // its moments (distinct values everywhere)
  fs::path root;
};

Saved make_state() {
  auto m = policy::Model::create(tiny_moe(), 11);
  EXPECT_TRUE(m.ok());
  Saved s{std::move(*m), AdamW(0), fs::temp_directory_path() / ("troupe_ep_ranges_" + std::to_string(::getpid()))};
  s.moments = AdamW(s.model.params().size());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 1);
  for (float& v : s.moments.exp_avg()) v = nd(rng);
  for (float& v : s.moments.exp_avg_sq()) v = std::abs(nd(rng));
  s.moments.set_steps(5);
  fs::remove_all(s.root);
  return s;
}

CheckpointData data_of_step(int64_t step) {
  CheckpointData d;
  d.step = step;
  d.policy_version = step;
  return d;
}

// The whole layout, as a learner without EP (or learner 0 with the whole model) writes it.
std::string save_whole(const Saved& s) {
  auto dir = save_checkpoint((s.root / "whole").string(), data_of_step(3), policy_model_writer(s.model), s.moments,
                             s.model.tensors(), {});
  EXPECT_TRUE(dir.ok()) << (dir.ok() ? "" : dir.error().message);
  return dir.ok() ? *dir : "";
}

// A sharded checkpoint of the pieces `bounds` (every file written by this one process: the files a
// sharded run's ranks, or a divided run's learners, write), `layout` recorded in shards.json.
std::string save_pieces(const Saved& s, const std::string& name, const std::vector<size_t>& bounds,
                        const std::string& layout) {
  RankShard shard{{}, {}, {}, bounds, &s.model.tensors(), "model", layout.empty() ? "optimizer" : "none", 5};
  shard.pieced = true;
  shard.layout = layout;
  const auto p = std::as_const(s.model).params();
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    const size_t b = bounds[i], n = bounds[i + 1] - bounds[i];
    shard.pieces.push_back({i, p.subspan(b, n), std::as_const(s.moments).exp_avg().subspan(b, n),
                            std::as_const(s.moments).exp_avg_sq().subspan(b, n)});
  }
  LocalCommunicator comm;
  auto dir = save_sharded_checkpoint((s.root / name).string(), data_of_step(3), [](const std::string&) { return Status{}; },
                                     shard, comm, {});
  EXPECT_TRUE(dir.ok()) << (dir.ok() ? "" : dir.error().message);
  return dir.ok() ? *dir : "";
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A divided learner's resume before load_checkpoint_ranges: the whole moments and weights read,
// then its part kept (take_local); `bytes` the safetensors data bytes that read (checksums not counted).
struct CutWhole {
  std::vector<float> params, exp_avg, exp_avg_sq;
  uint64_t bytes = 0;
};
CutWhole read_whole_then_cut(const std::string& dir, const policy::ExpertShardLayout& layout, size_t n) {
  CutWhole out;
  const uint64_t before = policy::io::safetensors_data_bytes_read();
  AdamW moments(layout.whole_size);
  EXPECT_TRUE(load_checkpoint_share(dir, layout.whole_table, 0, layout.whole_size, moments).ok());
  std::vector<float> whole(layout.whole_size);
  if (is_sharded_checkpoint(dir)) {
    EXPECT_TRUE(read_sharded_params(dir, layout.whole_table, whole).ok());
  } else {
    auto loaded = policy::io::load_model(dir);
    EXPECT_TRUE(loaded.ok());
    if (loaded.ok()) whole.assign(loaded->model.params().begin(), loaded->model.params().end());
  }
  out.bytes = policy::io::safetensors_data_bytes_read() - before;
  for (auto [from, to] : {std::pair{std::span<const float>(whole), &out.params},
                          std::pair{std::as_const(moments).exp_avg(), &out.exp_avg},
                          std::pair{std::as_const(moments).exp_avg_sq(), &out.exp_avg_sq}}) {
    to->resize(n);
    take_local(from, layout, *to);
  }
  return out;
}

// Every block of E loads its part of `dir`: the values of the whole state cut to the block, bit for
// bit, reading exactly its own values' bytes of the three buffers.
void expect_blocks_load(const Saved& s, const std::string& dir, int E) {
  for (int p = 0; p < E; ++p) {
    SCOPED_TRACE(dir + ": block " + std::to_string(p) + " of " + std::to_string(E));
    auto made = policy::Model::create_expert_block(tiny_moe(), 99, p, E);  // (other values than the saved ones)
    ASSERT_TRUE(made.ok()) << made.error().message;
    policy::Model& block = *made;
    const policy::ExpertShardLayout& layout = *block.expert_shards();
    const size_t n = block.params().size();
    AdamW moments(n);
    const uint64_t before = policy::io::safetensors_data_bytes_read();
    auto d = load_checkpoint_ranges(dir, layout.whole_table, held_ranges(layout), block.params(), moments);
    const uint64_t read = policy::io::safetensors_data_bytes_read() - before;
    ASSERT_TRUE(d.ok()) << d.error().message;
    EXPECT_EQ(d->step, 3);
    EXPECT_EQ(moments.steps(), 5);
    EXPECT_EQ(read, 3 * 4 * n) << "bytes read of the checkpoint's weight and moment files (the whole model holds "
                               << s.model.params().size() << " values per buffer)";
    // what the resume loaded before, bit for bit, and the bytes that read
    const CutWhole before_ranges = read_whole_then_cut(dir, layout, n);
    EXPECT_TRUE(same_bits(std::as_const(block).params(), before_ranges.params)) << "weights, as read whole and cut";
    EXPECT_TRUE(same_bits(std::as_const(moments).exp_avg(), before_ranges.exp_avg)) << "exp_avg, as read whole and cut";
    EXPECT_TRUE(same_bits(std::as_const(moments).exp_avg_sq(), before_ranges.exp_avg_sq)) << "exp_avg_sq, as read whole and cut";
    if (p == 0)
      std::printf("  %s, block 0 of %d: read %llu bytes of weights and moments; read whole, then cut: %llu\n",
                  fs::path(dir).parent_path().filename().c_str(), E, static_cast<unsigned long long>(read),
                  static_cast<unsigned long long>(before_ranges.bytes));
    std::vector<float> want(n);
    take_local(std::as_const(s.model).params(), layout, want);
    EXPECT_TRUE(same_bits(std::as_const(block).params(), want)) << "weights";
    take_local(std::as_const(s.moments).exp_avg(), layout, want);
    EXPECT_TRUE(same_bits(std::as_const(moments).exp_avg(), want)) << "exp_avg";
    take_local(std::as_const(s.moments).exp_avg_sq(), layout, want);
    EXPECT_TRUE(same_bits(std::as_const(moments).exp_avg_sq(), want)) << "exp_avg_sq";
    // the trainer of a divided model takes them as its own moments
    ModelAdapter a(block);
    LearnerConfig c;
    c.expert_parallel = E;
    LocalCommunicator comm;
    Trainer tr(a, c, comm);
    ASSERT_TRUE(tr.load_optimizer_share(moments).ok());
    EXPECT_TRUE(same_bits(std::as_const(tr).optimizer().exp_avg_sq(), want));
    EXPECT_FALSE(tr.load_optimizer_share(AdamW(n + 1)).ok());
  }
}

// Overwrites the bytes of every routed expert of block `block` of E in dir/model.safetensors with NaN.
void poison_block(const std::string& dir, const policy::ExpertShardLayout& layout, int block, int E) {
  const std::string path = dir + "/model.safetensors";
  auto f = policy::io::SafetensorsFile::open(path, policy::io::DataLoad::on_demand);
  ASSERT_TRUE(f.ok());
  uint64_t header = 0;
  std::fstream io(path, std::ios::binary | std::ios::in | std::ios::out);
  io.read(reinterpret_cast<char*>(&header), 8);
  const int per = 4 / E;
  int poisoned = 0;
  for (const auto& t : layout.whole_table) {
    const auto at = t.name.find(".experts.");
    if (at == std::string::npos || std::stoi(t.name.substr(at + 9)) / per != block) continue;
    const auto* e = f->find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    const std::vector<char> nan(e->end - e->begin, static_cast<char>(0xff));
    io.seekp(static_cast<std::streamoff>(8 + header + e->begin));
    io.write(nan.data(), static_cast<std::streamsize>(nan.size()));
    ++poisoned;
  }
  ASSERT_TRUE(io.flush());
  ASSERT_GT(poisoned, 0);
}

}  // namespace

TEST(ExpertParallelResumeOwnRanges, EveryLayoutEveryBlock) {
  Saved s = make_state();
  const auto& table = s.model.tensors();
  const std::string whole = save_whole(s);
  const std::string zero = save_pieces(s, "zero", shard_bounds(s.model.params().size(), 3), "");
  const std::string runs2 = save_pieces(s, "runs2", actors::sync_run_bounds(actors::expert_sync_runs(table, 2)), "expert_runs 2");
  const std::string runs4 = save_pieces(s, "runs4", actors::sync_run_bounds(actors::expert_sync_runs(table, 4)), "expert_runs 4");
  for (const std::string& dir : {whole, zero, runs2, runs4}) {
    ASSERT_FALSE(dir.empty());
    ASSERT_TRUE(verify_checkpoint(dir).ok()) << dir;
    expect_blocks_load(s, dir, 2);
    expect_blocks_load(s, dir, 4);
  }
  fs::remove_all(s.root);
}

// A sharded learner (learner.shard, rank r of 3) resuming: its share of the moments alone (ZeRO-1/2,
// the weights' files not opened), or with its shard of the weights (ZeRO-3 keeping only its shard),
// from every layout, reading exactly those values' bytes.
TEST(ExpertParallelResumeOwnRanges, ShardedLearnerReadsItsShareAlone) {
  Saved s = make_state();
  const auto& table = s.model.tensors();
  const size_t N = s.model.params().size();
  const std::string whole = save_whole(s);
  const std::string zero = save_pieces(s, "zero", shard_bounds(N, 2), "");
  const std::string runs2 = save_pieces(s, "runs2", actors::sync_run_bounds(actors::expert_sync_runs(table, 2)), "expert_runs 2");
  const auto bounds = shard_bounds(N, 3);
  for (const std::string& dir : {whole, zero, runs2}) {
    ASSERT_FALSE(dir.empty());
    for (int r = 0; r < 3; ++r)
      for (bool with_weights : {false, true}) {
        SCOPED_TRACE(dir + ": rank " + std::to_string(r) + (with_weights ? ", with its weights" : ", moments alone"));
        const size_t lo = bounds[static_cast<size_t>(r)], n = bounds[static_cast<size_t>(r) + 1] - lo;
        AdamW moments(n);
        std::vector<float> params(with_weights ? n : 0);
        const HeldRange share[1] = {{lo, 0, n}};
        const uint64_t before = policy::io::safetensors_data_bytes_read();
        auto d = load_checkpoint_ranges(dir, table, share, params, moments);
        const uint64_t read = policy::io::safetensors_data_bytes_read() - before;
        ASSERT_TRUE(d.ok()) << d.error().message;
        EXPECT_EQ(moments.steps(), 5);
        EXPECT_EQ(read, (with_weights ? 12 : 8) * n);
        EXPECT_TRUE(same_bits(std::as_const(moments).exp_avg(), std::as_const(s.moments).exp_avg().subspan(lo, n)));
        EXPECT_TRUE(same_bits(std::as_const(moments).exp_avg_sq(), std::as_const(s.moments).exp_avg_sq().subspan(lo, n)));
        if (with_weights) {
          EXPECT_TRUE(same_bits(params, std::as_const(s.model).params().subspan(lo, n)));
        }
      }
  }
  fs::remove_all(s.root);
}

TEST(ExpertParallelResumeOwnRanges, OtherBlocksBytesNeverRead) {
  Saved s = make_state();
  const std::string whole = save_whole(s);
  ASSERT_FALSE(whole.empty());
  auto b0 = policy::Model::create_expert_block(tiny_moe(), 99, 0, 2);
  ASSERT_TRUE(b0.ok());
  poison_block(whole, *b0->expert_shards(), 1, 2);  // (the checkpoint no longer verifies: not asked here)
  const policy::ExpertShardLayout& layout = *b0->expert_shards();
  AdamW moments(b0->params().size());
  auto d = load_checkpoint_ranges(whole, layout.whole_table, held_ranges(layout), b0->params(), moments);
  ASSERT_TRUE(d.ok()) << d.error().message;
  std::vector<float> want(b0->params().size());
  take_local(std::as_const(s.model).params(), layout, want);
  EXPECT_TRUE(same_bits(std::as_const(*b0).params(), want));
  // the learner of block 1 reads them
  auto b1 = policy::Model::create_expert_block(tiny_moe(), 99, 1, 2);
  ASSERT_TRUE(b1.ok());
  ASSERT_TRUE(load_checkpoint_ranges(whole, b1->expert_shards()->whole_table, held_ranges(*b1->expert_shards()),
                                     b1->params(), moments)
                  .ok());
  EXPECT_TRUE(std::isnan(std::as_const(*b1).params()[held_ranges(*b1->expert_shards())[1].local]));
  fs::remove_all(s.root);
}

TEST(ExpertParallelResumeOwnRanges, ErrorsNameFileAndTensor) {
  Saved s = make_state();
  const std::string whole = save_whole(s);
  const std::string zero = save_pieces(s, "zero", shard_bounds(s.model.params().size(), 3), "");
  policy::ModelConfig other = tiny_moe();
  other.moe_intermediate_size = 8;
  auto b = policy::Model::create_expert_block(other, 99, 0, 2);
  ASSERT_TRUE(b.ok());
  const policy::ExpertShardLayout& layout = *b->expert_shards();
  AdamW moments(b->params().size());
  auto r = load_checkpoint_ranges(whole, layout.whole_table, held_ranges(layout), b->params(), moments);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("model.safetensors: tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' has shape (16, 16), the model's (8, 16)"),
            std::string::npos)
      << r.error().message;
  r = load_checkpoint_ranges(zero, layout.whole_table, held_ranges(layout), b->params(), moments);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("(the checkpoint is of another model)"), std::string::npos) << r.error().message;
  fs::resize_file(fs::path(zero) / "shards/rank_2.safetensors", 100);
  auto mine = policy::Model::create_expert_block(tiny_moe(), 99, 1, 2);
  ASSERT_TRUE(mine.ok());
  AdamW m2(mine->params().size());
  r = load_checkpoint_ranges(zero, mine->expert_shards()->whole_table, held_ranges(*mine->expert_shards()),
                             mine->params(), m2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("rank_2.safetensors (rank 2 of 3) has 100 bytes"), std::string::npos)
      << r.error().message;
  fs::remove_all(s.root);
}
