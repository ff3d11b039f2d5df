// policy.expert_parallel_block: a learner's block of the experts built without the whole model
// (Model::create_expert_block, policy::io::load_expert_block) is the whole model's
// slice_experts(shard, shards) bit for bit: the tensor table, the layout and every value, for a
// random init (every MoE family, 2 and 4 blocks) and for transformers-made directories in every
// expert layout (per expert, fused, fused transposed, bf16, sharded by an index, a sharded learner's
// checkpoint, each block reading its own values' bytes alone); the safetensors
// reader's on-demand rows are its eager reads; the layout's pieces tile the arena, each block's
// holding its experts alone (expert_blocks.h); on a device backend (cpu_fenced) each is the cpu
// block; what cannot be divided is refused naming why.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <utility>

#include "../test_models.h"
#include "test_temp_dir.h"
#include "troupe/base/build_config.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/sharded_weights.h"
#include "troupe/policy/expert_blocks.h"

namespace fs = std::filesystem;
using namespace troupe::policy;
using namespace troupe::policy::io;

namespace {

fs::path fixture(const std::string& sub) { return fs::path(TROUPE_SOURCE_DIR) / "tests" / "hf_fixture" / sub; }
fs::path gguf_fixture(const std::string& name) { return fs::path(TROUPE_SOURCE_DIR) / "tests" / "gguf" / name; }
fs::path temp_dir(const std::string& name) { return troupe::policy::io::testing::make_temp_dir("expert_block", name); }

void expect_same_table(const std::vector<TensorSpec>& a, const std::vector<TensorSpec>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name) << i;
    EXPECT_EQ(a[i].shape, b[i].shape) << a[i].name;
    EXPECT_EQ(a[i].offset, b[i].offset) << a[i].name;
  }
}

// The layout's pieces tile the whole arena, each of one owner: block q's hold only routed experts of
// q (expert e of num_experts / shards per block, by name: routed_expert_of) and the others none;
// the held pieces tile the block's own arena in order.
void expect_layout_tiles(const ExpertShardLayout& l, size_t local_size) {
  size_t whole = 0, local = 0;
  int experts = 0;
  for (const TensorSpec& t : l.whole_table) experts = std::max(experts, routed_expert_of(t.name) + 1);
  for (const ArenaPiece& p : l.pieces) {
    EXPECT_EQ(p.whole, whole);
    whole += p.size;
    const bool held = p.owner < 0 || p.owner == l.shard;
    EXPECT_EQ(p.local, held ? local : ArenaPiece::npos) << p.whole;
    if (held) local += p.size;
    for (const TensorSpec& t : l.whole_table)
      if (t.offset >= p.whole && t.offset < p.whole + p.size) {
        const int e = routed_expert_of(t.name);
        EXPECT_EQ(p.owner, e < 0 ? -1 : e / (experts / l.shards)) << t.name;
      }
  }
  EXPECT_EQ(whole, l.whole_size);
  EXPECT_EQ(local, local_size);
}

// `block` is `sliced` bit for bit: the same table, layout and parameter bits.
void expect_same_block(const Model& block, const Model& sliced) {
  expect_same_table(block.tensors(), sliced.tensors());
  const ExpertShardLayout* a = block.expert_shards();
  const ExpertShardLayout* b = sliced.expert_shards();
  ASSERT_TRUE(a && b);
  expect_layout_tiles(*a, block.params().size());
  EXPECT_EQ(a->shard, b->shard);
  EXPECT_EQ(a->shards, b->shards);
  EXPECT_EQ(a->whole_size, b->whole_size);
  ASSERT_EQ(a->pieces.size(), b->pieces.size());
  for (size_t i = 0; i < a->pieces.size(); ++i) {
    EXPECT_EQ(a->pieces[i].whole, b->pieces[i].whole) << i;
    EXPECT_EQ(a->pieces[i].local, b->pieces[i].local) << i;
    EXPECT_EQ(a->pieces[i].size, b->pieces[i].size) << i;
    EXPECT_EQ(a->pieces[i].owner, b->pieces[i].owner) << i;
  }
  expect_same_table(a->whole_table, b->whole_table);
  ASSERT_EQ(block.params().size(), sliced.params().size());
  EXPECT_EQ(std::memcmp(block.params().data(), sliced.params().data(), sizeof(float) * block.params().size()), 0);
}

// Every block of `shards` of the directory (or .gguf) at path, loaded alone, against the whole load's slices.
void expect_blocks_of_dir(const fs::path& path, int shards) {
  auto whole = load_model(path.string());
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  for (int s = 0; s < shards; ++s) {
    auto sliced = whole->model.slice_experts(s, shards);
    ASSERT_TRUE(sliced.ok()) << sliced.error().message;
    auto block = load_expert_block(path.string(), s, shards);
    ASSERT_TRUE(block.ok()) << block.error().message;
    SCOPED_TRACE(path.string() + ": block " + std::to_string(s) + " of " + std::to_string(shards));
    expect_same_block(block->model, *sliced);
    EXPECT_EQ(block->tokenizer != nullptr, whole->tokenizer != nullptr);
    EXPECT_EQ(block->eos_token_id, whole->eos_token_id);
  }
}

// A copy of a fixture whose weights are rewritten by `rewrite` (on-disk names -> the files to write).
fs::path rewritten_fixture(const std::string& sub, const std::string& name,
                           const std::function<void(const TensorMap&, const fs::path&)>& rewrite) {
  const fs::path d = temp_dir(name);
  for (const char* f : {"config.json", "tokenizer.json"}) fs::copy_file(fixture(sub) / f, d / f);
  auto tensors = read_safetensors((fixture(sub) / "model.safetensors").string());
  EXPECT_TRUE(tensors.ok()) << tensors.error().message;
  rewrite(*tensors, d);
  return d;
}

void expect_error(const troupe::Error& e, const std::string& part) {
  EXPECT_EQ(e.code, troupe::ErrorCode::invalid_input) << e.message;
  EXPECT_NE(e.message.find(part), std::string::npos) << "'" << part << "' not in: " << e.message;
}

}  // namespace

TEST(ExpertBlock, RandomInitIsTheWholeModelsSlice) {
  for (const char* family : {"qwen3_moe", "mixtral", "qwen2_moe"}) {
    for (bool tied : {false, true}) {
      ModelConfig c = test::tiny_family(family);
      c.tie_word_embeddings = tied;
      c.num_experts = 8;
      if (tied) c.mlp_only_layers.clear();  // every layer MoE
      auto whole = Model::create(c, 1234);
      ASSERT_TRUE(whole.ok()) << whole.error().message;
      for (int shards : {2, 4, 8})
        for (int s = 0; s < shards; ++s) {
          SCOPED_TRACE(std::string(family) + (tied ? " tied" : "") + ": block " + std::to_string(s) + " of " +
                       std::to_string(shards));
          auto sliced = whole->slice_experts(s, shards);
          ASSERT_TRUE(sliced.ok()) << sliced.error().message;
          auto block = Model::create_expert_block(c, 1234, s, shards);
          ASSERT_TRUE(block.ok()) << block.error().message;
          expect_same_block(*block, *sliced);
        }
    }
  }
}

TEST(ExpertBlock, RefusesWhatSliceExpertsRefuses) {
  ModelConfig c = test::tiny("qwen3_moe");
  expect_error(Model::create_expert_block(c, 1, 0, 3).error(), "expert block 0 of 3 of num_experts = 4");
  expect_error(Model::create_expert_block(c, 1, 2, 2).error(), "expert block 2 of 2 of num_experts = 4");
  ModelConfig dense = test::tiny_family("qwen3");
  expect_error(Model::create_expert_block(dense, 1, 0, 2).error(), "the model has no MoE layer");
  ModelConfig lora = c;
  lora.lora.rank = 4;
  expect_error(Model::create_expert_block(lora, 1, 0, 2).error(), "not with LoRA adapters (policy.lora)");
  ModelConfig quant = c;
  quant.base_dtype = BaseDtype::bf16;
  expect_error(Model::create_expert_block(quant, 1, 0, 2).error(), "not with a quantized base");
}

// On a device backend (cpu_fenced: device memory the host cannot touch, host mirrors) a block made
// alone, sliced from a whole device model or loaded from a directory is the cpu block bit for bit.
TEST(ExpertBlock, OnADeviceBackendTheBlockIsTheCpuBlock) {
  ModelConfig c = test::tiny_family("qwen3_moe");
  c.num_experts = 8;
  ModelConfig fenced = c;
  fenced.device = troupe::kernels::DeviceKind::cpu_fenced;
  auto whole = Model::create(fenced, 1234);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  ASSERT_FALSE(whole->backend().host_visible());
  ExecutionOptions exec;
  exec.device = troupe::kernels::DeviceKind::cpu_fenced;
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE("block " + std::to_string(s) + " of 2");
    auto cpu = Model::create_expert_block(c, 1234, s, 2);
    ASSERT_TRUE(cpu.ok()) << cpu.error().message;
    auto block = Model::create_expert_block(fenced, 1234, s, 2);
    ASSERT_TRUE(block.ok()) << block.error().message;
    EXPECT_FALSE(block->backend().host_visible());
    expect_same_block(*block, *cpu);
    auto sliced = whole->slice_experts(s, 2);
    ASSERT_TRUE(sliced.ok()) << sliced.error().message;
    expect_same_block(*sliced, *cpu);
    auto loaded_cpu = load_expert_block(fixture("qwen3_moe").string(), s, 2);
    ASSERT_TRUE(loaded_cpu.ok()) << loaded_cpu.error().message;
    auto loaded = load_expert_block(fixture("qwen3_moe").string(), s, 2, exec);
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    EXPECT_FALSE(loaded->model.backend().host_visible());
    expect_same_block(loaded->model, loaded_cpu->model);
  }
}

TEST(ExpertBlock, TransformersDirectoriesInEveryLayout) {
  // per expert (mixtral: block_sparse_moe names; qwen2_moe: a gated shared expert) and fused
  for (const char* sub : {"mixtral", "mixtral_fused", "qwen3_moe", "qwen3_moe_fused", "qwen2_moe"})
    for (int shards : {2, 4}) expect_blocks_of_dir(fixture(sub), shards);
}

TEST(ExpertBlock, TransposedFusedBf16AndIndexedShards) {
  // fused transposed: gate_up (E, C, 2H), down (E, H, C), in bf16 (read on demand, converted)
  const fs::path transposed = rewritten_fixture("qwen3_moe_fused", "transposed", [](const TensorMap& t, const fs::path& d) {
    TensorMap out;
    for (const auto& [name, x] : t) {
      if (!name.ends_with("mlp.experts.gate_up_proj") && !name.ends_with("mlp.experts.down_proj")) {
        out[name] = x;
        continue;
      }
      const int64_t E = x.shape[0], A = x.shape[1], B = x.shape[2];
      Tensor y{{E, B, A}, std::vector<float>(x.data.size())};
      for (int64_t e = 0; e < E; ++e)
        for (int64_t a = 0; a < A; ++a)
          for (int64_t b = 0; b < B; ++b) y.data[(e * B + b) * A + a] = x.data[(e * A + a) * B + b];
      out[name] = std::move(y);
    }
    ASSERT_TRUE(write_safetensors((d / "model.safetensors").string(), out, {}, DType::bf16).ok());
  });
  expect_blocks_of_dir(transposed, 2);
  // per expert, split over two files listed by model.safetensors.index.json
  const fs::path indexed = rewritten_fixture("mixtral", "indexed", [](const TensorMap& t, const fs::path& d) {
    TensorMap a, b;
    nlohmann::json map = nlohmann::json::object();
    int i = 0;
    for (const auto& [name, x] : t) {
      const bool first = i++ % 2 == 0;
      (first ? a : b)[name] = x;
      map[name] = first ? "part-1.safetensors" : "part-2.safetensors";
    }
    ASSERT_TRUE(write_safetensors((d / "part-1.safetensors").string(), a).ok());
    ASSERT_TRUE(write_safetensors((d / "part-2.safetensors").string(), b).ok());
    std::ofstream((d / "model.safetensors.index.json").string()) << nlohmann::json{{"weight_map", map}}.dump();
  });
  expect_blocks_of_dir(indexed, 2);
}

TEST(ExpertBlock, ShardedCheckpointBlockReadsItsValuesAlone) {
  // a sharded learner's checkpoint (shards.json, 3 files) as policy.path: each block from the ranges of
  // the files that hold its values, exactly its own values' bytes read (each file opened is hashed too)
  auto whole = load_model(fixture("qwen3_moe").string());
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  const std::span<const float> params = std::as_const(whole->model).params();
  const fs::path sharded = rewritten_fixture("qwen3_moe", "sharded", [&](const TensorMap&, const fs::path& d) {
    ShardManifest m;
    m.world_size = 3;
    m.bounds = {0, params.size() / 3, 2 * params.size() / 3, params.size()};
    m.tensors = whole->model.tensors();
    for (int r = 0; r < 3; ++r) {
      const size_t lo = m.bounds[static_cast<size_t>(r)], hi = m.bounds[static_cast<size_t>(r) + 1];
      auto f = write_shard_file(d.string(), r, 3, lo, hi, {{kShardParams, params.subspan(lo, hi - lo)}});
      ASSERT_TRUE(f.ok()) << f.error().message;
      m.files.push_back(*f);
    }
    ASSERT_TRUE(write_shard_manifest(d.string(), m).ok());
  });
  expect_blocks_of_dir(sharded, 2);
  const uint64_t before = safetensors_data_bytes_read();
  auto block = load_expert_block(sharded.string(), 1, 2);
  ASSERT_TRUE(block.ok()) << block.error().message;
  EXPECT_EQ(safetensors_data_bytes_read() - before, 4 * block->model.params().size());
  EXPECT_LT(block->model.params().size(), params.size());
}

TEST(ExpertBlock, OnDemandRowsAreTheEagerReads) {
  const std::string path = (fixture("mixtral_fused") / "model.safetensors").string();
  auto eager = SafetensorsFile::open(path);
  auto lazy = SafetensorsFile::open(path, DataLoad::on_demand);
  ASSERT_TRUE(eager.ok() && lazy.ok());
  for (const auto& e : eager->entries()) {
    auto a = eager->read(e.name);
    auto b = lazy->read(e.name);
    ASSERT_TRUE(a.ok() && b.ok()) << e.name;
    EXPECT_EQ(a->shape, b->shape);
    EXPECT_EQ(a->data, b->data) << e.name;
  }
  const std::string gate_up = "model.layers.1.mlp.experts.gate_up_proj";
  const std::vector<int64_t> shape = eager->find(gate_up)->shape;
  auto all = eager->read(gate_up);
  auto rows = lazy->read_rows(gate_up, shape, 1, 2);
  ASSERT_TRUE(all.ok() && rows.ok()) << (rows.ok() ? "" : rows.error().message);
  const size_t row = all->data.size() / static_cast<size_t>(shape[0]);
  EXPECT_EQ(rows->shape, (std::vector<int64_t>{2, shape[1], shape[2]}));
  EXPECT_EQ(rows->data, std::vector<float>(all->data.begin() + row, all->data.begin() + 3 * row));
  expect_error(lazy->read_rows(gate_up, shape, 3, 2).error(), "has no rows [3, 5)");
  // on demand, a read costs its own bytes alone (pread on the file's one descriptor)
  const SafetensorsEntry* entry = lazy->find(gate_up);
  const uint64_t before = safetensors_data_bytes_read();
  ASSERT_TRUE(lazy->read_rows(gate_up, shape, 1, 2).ok());
  EXPECT_EQ(safetensors_data_bytes_read() - before, 2 * (entry->end - entry->begin) / static_cast<uint64_t>(shape[0]));
  std::vector<float> flat(5);
  ASSERT_TRUE(lazy->read_flat(gate_up, row + 3, flat).ok());
  EXPECT_EQ(flat, std::vector<float>(all->data.begin() + static_cast<std::ptrdiff_t>(row) + 3,
                                     all->data.begin() + static_cast<std::ptrdiff_t>(row) + 8));
  expect_error(lazy->read_flat(gate_up, all->data.size() - 2, flat).error(), "has no values [");
  expect_error(lazy->read_rows(gate_up, {1, 2, 3}, 0, 1).error(), "expected (1, 2, 3)");
}

TEST(ExpertBlock, LoadRefusals) {
  // A block that does not divide the experts names config.json; a dense GGUF (imported, then read)
  // has no experts to divide; a quantized base is refused before anything is read.
  auto three = load_expert_block(fixture("qwen3_moe").string(), 0, 3);
  ASSERT_FALSE(three.ok());
  expect_error(three.error(), "config.json: policy.moe.expert_parallel: expert block 0 of 3 of num_experts = 4");
  const fs::path cache = temp_dir("cache");
  ::setenv("TROUPE_CACHE", cache.c_str(), 1);
  auto dense = load_expert_block(gguf_fixture("tiny_qwen3.gguf").string(), 0, 2);
  ASSERT_FALSE(dense.ok());
  expect_error(dense.error(), "the model has no MoE layer");
  ExecutionOptions q;
  q.base_dtype = BaseDtype::q8_0;
  auto quant = load_expert_block(fixture("qwen3_moe").string(), 0, 2, q);
  ASSERT_FALSE(quant.ok());
  expect_error(quant.error(), "not with a quantized base (policy.base_dtype)");
}
