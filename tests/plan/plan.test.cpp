// launch.plan: the memory planner on published model shapes (models/*/config.json: parameter
// counts as the model cards give them), a tiny fresh model, LoRA, the ZeRO stages, the budget
// check's message, the JSON fields, and byte sizes. No weights are read anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/launch/config.h"
#include "troupe/launch/plan.h"
#include "troupe/policy/io/gguf.h"

namespace troupe::launch {
namespace {

const std::string kDir = TROUPE_PLAN_DIR;

const char* kTiny = R"(
envs:
  - name: arithmetic
rollout:
  max_prompt_length: 16
  max_response_length: 8
  num_generations: 4
  prompts_per_step: 8
)";

actors::ExperimentConfig load(const std::string& text, const std::vector<std::string>& sets = {}) {
  auto r = load_config_text(text, "plan.yaml", sets);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r->config : actors::ExperimentConfig{};
}

MemoryPlan plan_of(const actors::ExperimentConfig& c, const PlanOptions& o = {}) {
  auto p = plan_memory(c, "plan.yaml", o);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
  return p.ok() ? *p : MemoryPlan{};
}

MemoryPlan plan_model(const std::string& model, std::vector<std::string> sets = {}, const PlanOptions& o = {}) {
  sets.push_back("policy.path=" + kDir + "/models/" + model);
  return plan_of(load(kTiny, sets), o);
}

const PlanRow& row(const MemoryPlan& p, const std::string& role, int index = 0) {
  for (const auto& r : p.rows)
    if (r.role == role && r.index == index) return r;
  throw std::runtime_error("no row " + role);
}

TEST(Plan, PublishedParameterCounts) {
  EXPECT_EQ(plan_model("smollm2-135m").params, 134515008u);
  EXPECT_EQ(plan_model("llama-3-8b").params, 8030261248u);
  EXPECT_EQ(plan_model("qwen3-8b").params, 8190735360u);
  EXPECT_EQ(plan_model("qwen3-1.7b").params, 1720574976u);  // tied embeddings
  EXPECT_EQ(plan_model("qwen3-30b-a3b").params, 30532122624u);
}

TEST(Plan, TinyConfigRolesAndRanks) {
  const MemoryPlan p = plan_of(load(kTiny, {"cluster.generators=2", "cluster.env_workers=2"}));
  ASSERT_EQ(p.rows.size(), 6u);  // learner, 2 generators, coordinator, 2 env workers
  const PlanRow& l = row(p, "learner");
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.weights, p.params * 4);
  EXPECT_EQ(l.gradients, p.params * 4);
  EXPECT_EQ(l.optimizer, p.params * 8);  // AdamW's two fp32 moments
  EXPECT_GT(l.activations, 0u);
  EXPECT_EQ(p.train_sequences, 32);
  EXPECT_EQ(p.train_tokens, 32 * 24);
  const PlanRow& g = row(p, "generator", 1);
  EXPECT_EQ(g.rank, 2);
  EXPECT_EQ(g.gradients, 0u);  // cpu: the generator's gradient arena is never touched
  // a step: 4 prompts x 4 samples; an eval: eval.num_prompts (64) in one request. 24 tokens each,
  // K and V of 4 layers x 2 kv heads x 32 dims, fp32
  EXPECT_EQ(p.kv_slots, 64);
  EXPECT_EQ(p.kv_context, 24);
  EXPECT_EQ(g.kv_cache, 64ull * 24 * 2 * 4 * 2 * 32 * 4);
  EXPECT_EQ(row(p, "env_worker", 1).rank, 4);
  EXPECT_EQ(row(p, "coordinator").rank, 0);
  const std::string t = plan_table(p);
  EXPECT_NE(t.find("learner 0 (0)"), std::string::npos) << t;
  EXPECT_NE(t.find("generator 1 (2)"), std::string::npos) << t;
  EXPECT_NE(t.find("env_worker 1 (4)"), std::string::npos) << t;
}

TEST(Plan, ActivationCheckpointingAndOffloadShrinkTheArena) {
  const auto plain = row(plan_model("smollm2-135m"), "learner").activations;
  const auto ckpt = row(plan_model("smollm2-135m", {"policy.activation_checkpointing=true"}), "learner").activations;
  const auto off = row(plan_model("smollm2-135m", {"policy.activation_checkpointing=true", "policy.offload_activations=true"}),
                       "learner").activations;
  EXPECT_LT(ckpt, plain / 4);
  EXPECT_LT(off, plain);  // on cpu the offload store is host memory too: counted, but the arena is smaller
}

TEST(Plan, LoraTrainsOnlyTheAdapters) {
  const MemoryPlan full = plan_model("qwen3-8b");
  const MemoryPlan lora = plan_model("qwen3-8b", {"policy.lora.rank=16"});
  // all_linear, r = 16: per layer r x (in + out) for q, k, v, o, gate, up, down
  const uint64_t per_layer = 16ull * ((4096 + 4096) + (4096 + 1024) * 2 + (4096 + 4096) + (4096 + 12288) * 3);
  EXPECT_EQ(lora.trainable, 36 * per_layer);
  EXPECT_EQ(lora.params, full.params);
  const PlanRow& l = row(lora, "learner");
  EXPECT_EQ(l.weights, (lora.params + lora.trainable) * 4);
  EXPECT_EQ(l.gradients, lora.trainable * 4);
  EXPECT_EQ(l.optimizer, lora.trainable * 8);
  // MoE: attention adapters, and the frozen experts' gradients of one layer in a sink
  const MemoryPlan moe = plan_model("qwen3-30b-a3b", {"policy.lora.rank=8", "policy.lora.targets=[q,k,v,o]"});
  const uint64_t sink = 2048ull * 128 + 3ull * 128 * 768 * 2048;
  EXPECT_EQ(row(moe, "learner").gradients, moe.trainable * 4 + sink * 4);
}

TEST(Plan, ShardedLearnersSyncTheWeightsFromTheirShards) {
  PlanOptions o;
  o.learners = 8;
  o.shard = ShardStage::parameters;
  const MemoryPlan p = plan_model("qwen3-8b", {"weight_sync.probe=false"}, o);
  const uint64_t P4 = p.params * 4, shard4 = (p.params + 7) / 8 * 4;
  uint64_t gens = 0;
  for (const auto& r : p.rows) gens += r.role == "generator" ? 1 : 0;
  // every learner's encoder over its shard in lean memory: its sent copy (a full piece is a view of
  // it), a delta's frames and payload of at most 1/16 of it each, and 8 runs of 256 KiB in flight to
  // each generator the root sends to; learner 0 like the others
  auto lean = [&](uint64_t held) { return held + 2 * ((held + 15) / 16) + gens * 8 * 256 * 1024; };
  for (int i : {0, 3}) EXPECT_EQ(row(p, "learner", i).sync, lean(shard4)) << i;
  EXPECT_EQ(row(p, "learner", 0).weights, row(p, "learner", 3).weights);
  // the coordinator (rank 0) joins only the pieces' heads: the learners send the weights themselves
  EXPECT_EQ(row(p, "coordinator").sync, 0u);
  EXPECT_NE(plan_table(p).find("each encodes its shard for the weight sync and sends it to the generators"),
            std::string::npos);
  // rank 0 hosts learner 0 and the coordinator: the budget holds both rows together
  const uint64_t r0 = row(p, "learner", 0).device + row(p, "coordinator").device;
  EXPECT_NE(plan_table(p).find("rank 0 (learner 0 and the coordinator): " + format_bytes(r0)), std::string::npos);
  // bf16 with the probe: half-size sync buffers; the probe runs layer by layer from the shards, so
  // learner 0 holds no more than the others
  const MemoryPlan b = plan_model("qwen3-8b", {"weight_sync.dtype=bf16"}, o);
  EXPECT_EQ(row(b, "learner", 3).sync, lean(shard4 / 2));
  EXPECT_EQ(row(b, "learner", 0).sync, lean(shard4 / 2));
  EXPECT_EQ(row(b, "learner", 0).weights, row(b, "learner", 3).weights);
  EXPECT_LT(row(b, "learner", 0).weights, P4);
  // the nccl broadcast sends learner 0's whole values: learner 0 encodes them alone, as unsharded
  const MemoryPlan n = plan_model("qwen3-8b", {"weight_sync.probe=false", "weight_sync.transport=nccl", "policy.device=cpu_fenced"}, o);
  EXPECT_EQ(row(n, "learner", 0).sync, 2 * P4);
  EXPECT_EQ(row(n, "learner", 3).sync, 0u);
  EXPECT_EQ(row(n, "coordinator").sync, 0u);
}

TEST(Plan, ShardStagesDivideByTheLearners) {
  PlanOptions o;
  o.learners = 8;
  const MemoryPlan none = plan_model("qwen3-8b", {}, o);
  EXPECT_EQ(none.rows.size(), 8u + 1 + 1 + 1);
  const uint64_t P4 = none.params * 4;
  EXPECT_EQ(row(none, "learner", 7).optimizer, 2 * P4);
  EXPECT_EQ(row(none, "learner", 7).rank, 7);
  EXPECT_EQ(row(none, "generator").rank, 8);
  // beyond two ranks the sum runs as a reduce-scatter: a scratch of 8 x 2^20 values, and (8.2 B
  // values are past Alltoallv's int offsets) a send buffer as large
  EXPECT_EQ(row(none, "learner", 7).collectives, 2ull * 8 * (1 << 20) * 4);
  o.shard = ShardStage::optimizer;
  const PlanRow z1 = row(plan_model("qwen3-8b", {}, o), "learner", 3);
  EXPECT_EQ(z1.optimizer, 2 * P4 / 8);
  EXPECT_EQ(z1.gradients, P4);
  EXPECT_EQ(z1.weights, P4);
  o.shard = ShardStage::gradients;  // backward still fills the whole gradient arena
  const MemoryPlan g = plan_model("qwen3-8b", {}, o);
  EXPECT_EQ(row(g, "learner", 3).gradients, P4);
  EXPECT_EQ(row(g, "learner", 3).optimizer, 2 * P4 / 8);
  EXPECT_NE(plan_table(g).find("note: shard gradients"), std::string::npos);
  o.shard = ShardStage::parameters;
  const MemoryPlan p3 = plan_model("qwen3-8b", {}, o);
  const PlanRow z3 = row(p3, "learner", 3);
  // the shard, and the largest two groups whole at once (one computes, the next one's gather in
  // flight): the last layer and the head (151936 x 4096)
  const uint64_t shard4 = (none.params + 7) / 8 * 4, head4 = (151936ull * 4096 + 4096) * 4;
  const uint64_t layer4 = (2ull * 4096 + 4096ull * 4096 * 2 + 4096ull * 1024 * 2 + 3ull * 4096 * 12288 + 2 * 128) * 4;
  EXPECT_EQ(z3.weights, shard4 + layer4 + head4);
  // one micro-batch: the shard, the embedding's gradient (whole until the step's end), the head's
  // (reduce-scattered right after its backward, before any layer's) or two layers' (one's
  // reduce-scatter in flight during the next one's backward), and that reduce-scatter's receive
  // scratch (about a layer) beside the reduce-scatter rounds
  const uint64_t outer4 = 2 * head4 - 4096 * 4, embedding4 = outer4 - head4;
  EXPECT_EQ(z3.gradients, shard4 + std::max(outer4, embedding4 + 2 * layer4));
  EXPECT_EQ(z3.collectives, row(g, "learner", 3).collectives + layer4);
  EXPECT_EQ(z3.optimizer, 2 * P4 / 8);
  EXPECT_LT(z3.device, row(g, "learner", 3).device);
  EXPECT_EQ(row(p3, "learner", 0).weights, z3.weights);  // the probe too runs from the shards
  EXPECT_NE(plan_table(p3).find("note: shard parameters: each learner keeps its shard"), std::string::npos);
  // on a device: a sparse arena, one group mapped at a time (the gathers block), and two 2 MiB
  // granules per group (36 layers, the embedding, the head) in each arena; no receive scratch
  const MemoryPlan p3c = plan_model("qwen3-8b", {"policy.device=cuda"}, o);
  const PlanRow z3c = row(p3c, "learner", 3);
  const uint64_t edges = (36ull + 3) * (2ull << 20);
  EXPECT_EQ(z3c.weights, shard4 + std::max(layer4, head4) + edges);
  EXPECT_EQ(z3c.gradients, shard4 + std::max(outer4, embedding4 + layer4) + edges);
  EXPECT_EQ(z3c.collectives, row(g, "learner", 3).collectives);
  EXPECT_GE(z3c.host, 2 * P4);  // (the host mirror of the weights and gradients stays whole)
  EXPECT_NE(plan_table(p3c).find("into a sparse device arena"), std::string::npos);
  // LoRA adapters are gathered whole; on cuda the device arena stays whole: only AdamW is divided
  const MemoryPlan p3l = plan_model("qwen3-8b", {"policy.lora.rank=16"}, o);
  EXPECT_EQ(row(p3l, "learner", 3).weights, (p3l.params + p3l.trainable) * 4);
  EXPECT_NE(plan_table(p3l).find("LoRA adapters are gathered whole"), std::string::npos);
  // streamed parts (and distillation) run the step on the whole weights, gathered for it
  const MemoryPlan p3s = plan_model("qwen3-8b", {"rollout.async=true", "rollout.async_chunks=2"}, o);
  EXPECT_EQ(row(p3s, "learner", 3).weights, p3s.params * 4);
  EXPECT_EQ(row(p3s, "learner", 3).optimizer, 2 * P4 / 8);
  EXPECT_NE(plan_table(p3s).find("streamed parts (rollout.async_chunks > 1) gather the whole weights for a step"),
            std::string::npos);
  // the config's learner.shard, unless --shard says otherwise
  const MemoryPlan k = plan_model("qwen3-8b", {"learner.shard=optimizer", "cluster.learners=4"});
  EXPECT_EQ(k.shard, ShardStage::optimizer);
  EXPECT_EQ(row(k, "learner", 2).optimizer, 2 * P4 / 4);
  o.learners = 0;
  o.shard = ShardStage::none;
  EXPECT_EQ(row(plan_model("qwen3-8b", {"learner.shard=optimizer", "cluster.learners=4"}, o), "learner", 2).optimizer,
            2 * P4);
  // one learner: nothing to shard
  o.learners = 1;
  const PlanRow one = row(plan_model("qwen3-8b", {}, o), "learner");
  EXPECT_EQ(one.optimizer, 2 * P4);
  EXPECT_EQ(one.collectives, 0u);
}

// policy.moe.expert_parallel divides the experts: each learner holds num_experts / E experts of
// every MoE layer (weights, gradients, AdamW moments), learner 0 too (the weight sync goes from the
// blocks: each of the first group's learners keeps what the generators hold of its half, and writes
// its half of a checkpoint); with learner.shard
// optimizer the state stays whole (only the compute is split). The
// collectives add each MoE layer's exchanged rows (tokens x K rows of C + 2H kept, C + 1
// exchanged, 2H scratch, C + 1 packed).
TEST(Plan, ExpertParallelDividesTheExpertsAndAddsTheExchangedRows) {
  const std::vector<std::string> moe = {"cluster.learners=2", "policy.model.num_experts=4",
                                        "policy.model.num_experts_per_tok=2"};
  auto with_ep = moe;
  with_ep.push_back("policy.moe.expert_parallel=2");
  const auto cfg = load(kTiny, with_ep);
  const MemoryPlan dp = plan_of(load(kTiny, moe)), ep = plan_of(cfg);
  const auto& m = cfg.policy.model;
  uint64_t layers = 0;
  for (int l = 0; l < m.num_hidden_layers; ++l) layers += m.is_moe_layer(l) ? 1 : 0;
  ASSERT_GT(layers, 0u);
  const uint64_t C = m.hidden_size, H = m.moe_intermediate_size, rows = static_cast<uint64_t>(ep.train_tokens) * 2;
  const uint64_t away = layers * 3 * 2 * H * C * 4;  // the other learner's 2 experts of 4, in bytes
  const PlanRow &a = row(dp, "learner", 1), &b = row(ep, "learner", 1);
  EXPECT_EQ(b.weights, a.weights - away);
  EXPECT_EQ(b.gradients, a.gradients - away);
  EXPECT_EQ(b.optimizer, a.optimizer - 2 * away);
  const PlanRow &a0 = row(dp, "learner", 0), &b0 = row(ep, "learner", 0);
  EXPECT_EQ(b0.weights, b.weights);  // its block alone, as every learner's
  EXPECT_EQ(b0.optimizer, a0.optimizer - 2 * away);
  EXPECT_EQ(b0.sync, b.sync);  // the encoder of 1/2 of the values each (none of the whole copy)
  EXPECT_LT(b0.sync, a0.sync);
  EXPECT_EQ(b0.other, b.other);  // (no whole copy for a checkpoint either)
  EXPECT_NE(plan_table(ep).find("the first 2 learners send the generators their experts and 1/2 of the rest each"),
            std::string::npos);
  EXPECT_EQ(b.collectives - a.collectives, layers * rows * (3 * C + 4 * H + 2) * 4);
  EXPECT_NE(plan_table(ep).find("policy.moe.expert_parallel 2: each learner holds num_experts / 2 experts"),
            std::string::npos);
  // loss.kl_coef: the reference model is a block of the experts too, on learner 0 as well
  auto kl = with_ep;
  kl.push_back("loss.kl_coef=0.1");
  const MemoryPlan ek = plan_of(load(kTiny, kl));
  EXPECT_EQ(row(ek, "learner", 1).weights, 2 * b.weights);
  EXPECT_EQ(row(ek, "learner", 0).weights, b0.weights + b.weights);
  // learner.shard optimizer: every learner keeps every expert (ZeRO-1 divides the moments instead)
  auto zero1 = with_ep, zero1_dp = moe;
  zero1.push_back("learner.shard=optimizer");
  zero1_dp.push_back("learner.shard=optimizer");
  const MemoryPlan z = plan_of(load(kTiny, zero1)), zdp = plan_of(load(kTiny, zero1_dp));
  EXPECT_EQ(row(z, "learner", 1).weights, row(zdp, "learner", 1).weights);
  EXPECT_EQ(row(z, "learner", 1).optimizer, row(zdp, "learner", 1).optimizer);
  EXPECT_NE(plan_table(z).find("policy.moe.expert_parallel 2: each learner computes num_experts / 2 experts"),
            std::string::npos);
  // learner.shard parameters: every learner keeps its shard of every expert, each layer gathered whole
  auto zero3 = with_ep, zero3_dp = moe;
  zero3.push_back("learner.shard=parameters");
  zero3_dp.push_back("learner.shard=parameters");
  const MemoryPlan z3 = plan_of(load(kTiny, zero3)), z3dp = plan_of(load(kTiny, zero3_dp));
  EXPECT_EQ(row(z3, "learner", 1).weights, row(z3dp, "learner", 1).weights);
  EXPECT_EQ(row(z3, "learner", 1).gradients, row(z3dp, "learner", 1).gradients);
  EXPECT_NE(plan_table(z3).find("shard parameters: in its shard, each layer gathered with every expert"),
            std::string::npos);
}

TEST(Plan, BudgetRefusalNamesTheRoleAndRank) {
  MemoryPlan p = plan_model("smollm2-135m", {"learner.memory_budget=1GiB"});
  ASSERT_TRUE(p.capacity.has_value());
  EXPECT_EQ(*p.capacity, 1ull << 30);
  auto over = plan_overflow(p);
  ASSERT_TRUE(over.has_value());
  EXPECT_NE(over->find("learner 0 (rank 0) needs "), std::string::npos) << *over;
  EXPECT_NE(over->find("over learner.memory_budget 1.00 GiB"), std::string::npos) << *over;
  EXPECT_NE(plan_table(p).find("does not fit: learner 0 (rank 0)"), std::string::npos);
  // --device-memory is the tighter one here; a roomy one fits
  PlanOptions o;
  o.device_memory = 512ull << 20;
  p = plan_model("smollm2-135m", {"learner.memory_budget=1GiB"}, o);
  EXPECT_NE(plan_overflow(p)->find("over --device-memory 512 MiB"), std::string::npos);
  o.device_memory = 64ull << 30;
  EXPECT_FALSE(plan_overflow(plan_model("smollm2-135m", {}, o)).has_value());
  // the generator alone over budget: named as such
  o.device_memory = std::nullopt;
  p = plan_model("smollm2-135m", {"policy.lora.rank=8", "learner.memory_budget=1GiB", "rollout.prompts_per_step=64",
                                  "rollout.max_response_length=512", "grpo.micro_batch_tokens=1024",
                                  "policy.activation_checkpointing=true"});
  over = plan_overflow(p);
  ASSERT_TRUE(over.has_value());
  EXPECT_NE(over->find("generator 0 (rank 1)"), std::string::npos) << *over << plan_table(p);
}

TEST(Plan, BadBudgetIsAConfigError) {
  auto r = load_config_text(std::string(kTiny) + "learner:\n  memory_budget: lots\n", "b.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("b.yaml:10:"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("error: learner.memory_budget: \"lots\" is not a memory size"), std::string::npos)
      << r.error().message;
}

TEST(Plan, JsonFields) {
  PlanOptions o;
  o.device_memory = 80ull << 30;
  // cpu_fenced takes cuda's device path (a host mirror) on any build
  const nlohmann::json j = plan_json(plan_model("qwen3-1.7b", {"policy.device=cpu_fenced"}, o));
  for (const char* k : {"config", "device", "model", "parameters", "trainable_parameters", "shard", "learners",
                        "micro_batch_tokens", "kv_slots", "kv_context", "capacity_bytes", "fits", "overflow", "rows"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["device"], "cpu_fenced");
  EXPECT_EQ(j["capacity_bytes"], 80ull << 30);
  const auto& l = j["rows"][0];
  for (const char* k : {"role", "index", "rank", "weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                        "kv_cache_bytes", "sync_bytes", "collectives_bytes", "other_bytes", "device_bytes", "host_bytes",
                        "fits", "notes"})
    EXPECT_TRUE(l.contains(k)) << k;
  // a device backend: AdamW steps on the device (its moments there, mirrored on the host), and the
  // weights' host mirror is host memory
  EXPECT_EQ(l["device_bytes"].get<uint64_t>(),
            l["weights_bytes"].get<uint64_t>() + l["gradients_bytes"].get<uint64_t>() +
                l["activations_bytes"].get<uint64_t>() + l["collectives_bytes"].get<uint64_t>() +
                l["optimizer_bytes"].get<uint64_t>());
  EXPECT_GT(l["host_bytes"].get<uint64_t>(), l["optimizer_bytes"].get<uint64_t>());
  // learner.optimizer_offload: AdamW in host memory only
  const nlohmann::json off =
      plan_json(plan_model("qwen3-1.7b", {"policy.device=cpu_fenced", "learner.optimizer_offload=true"}, o));
  const auto& lo = off["rows"][0];
  EXPECT_EQ(lo["device_bytes"].get<uint64_t>(),
            lo["weights_bytes"].get<uint64_t>() + lo["gradients_bytes"].get<uint64_t>() +
                lo["activations_bytes"].get<uint64_t>() + lo["collectives_bytes"].get<uint64_t>());
  EXPECT_EQ(lo["host_bytes"].get<uint64_t>(), l["host_bytes"].get<uint64_t>());
}

TEST(Plan, Bf16ComputeKeepsFp32StateAndAddsOperandCopies) {
  const std::string path = "policy.path=" + kDir + "/models/qwen3-8b";
  auto bf16 = load_config_text(kTiny, "plan.yaml", {path, "policy.device=cuda", "policy.compute_dtype=bf16"});
  if (!bf16.ok()) GTEST_SKIP() << "a build without CUDA: " << bf16.error().message;
  const MemoryPlan b = plan_of(bf16->config);
  const MemoryPlan f = plan_model("qwen3-8b", {"policy.device=cuda"});
  EXPECT_EQ(row(b, "learner").weights, row(f, "learner").weights);
  EXPECT_EQ(row(b, "learner").optimizer, row(f, "learner").optimizer);
  // the largest weight (the 4096-column head chunk x 4096) and 768 rows x 12288, in bf16
  EXPECT_EQ(row(b, "learner").activations - row(f, "learner").activations, 2ull * (12288 * 4096 + 768ull * 12288));
}

TEST(Plan, ByteSizes) {
  EXPECT_EQ(*parse_byte_size("4GiB", "x"), 4ull << 30);
  EXPECT_EQ(*parse_byte_size("80GB", "x"), 80000000000ull);
  EXPECT_EQ(*parse_byte_size("1.5 gib", "x"), 3ull << 29);
  EXPECT_EQ(*parse_byte_size("512MiB", "x"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("1048576", "x"), 1048576u);
  EXPECT_EQ(*parse_byte_size("10kB", "x"), 10000u);
  for (const char* bad : {"", "GiB", "80 gigs", "-1GiB", "1..2GB", "0", "80G"}) {
    auto r = parse_byte_size(bad, "--device-memory");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().message.rfind("--device-memory: \"" + std::string(bad) + "\" is not a memory size", 0), 0u)
        << r.error().message;
  }
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(80ull << 30), "80.0 GiB");
}

TEST(Plan, GgufMetadataGivesTheShape) {
  const std::string gguf = kDir + "/../gguf/tiny_qwen3.gguf";
  auto file = policy::io::GgufFile::open(gguf);
  ASSERT_TRUE(file.ok()) << file.error().message;
  uint64_t numel = 0;
  for (const auto& t : file->tensors()) numel += static_cast<uint64_t>(t.numel());
  auto c = load(kTiny);
  c.policy.path = gguf;
  const MemoryPlan p = plan_of(c);
  EXPECT_EQ(p.params, numel);  // every GGUF tensor is one of the model's
  EXPECT_NE(p.model.find("GGUF metadata"), std::string::npos);
}

TEST(Plan, MissingModelConfigIsNamed) {
  auto c = load(kTiny);
  c.policy.path = kDir + "/models/none";
  auto p = plan_memory(c, "plan.yaml", {});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("cannot read " + kDir + "/models/none/config.json"), std::string::npos);
}

}  // namespace
}  // namespace troupe::launch
