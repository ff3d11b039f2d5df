// `troupe plan`: the memory every rank of an experiment will hold (weights, gradients, optimizer
// state, activations, KV cache, weight-sync and collective buffers), from the config and the
// model's shape alone (config.json / GGUF metadata / policy.model), never its weights; and the
// budget check `troupe run` / `troupe validate` make with it. Invariant: every per-model size comes
// from policy::model_footprint / training_activations (the model's own layout code).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/actors/experiment_config.h"
#include "troupe/base/enum_names.h"
#include "troupe/base/result.h"

namespace troupe::launch {

// The learners' ZeRO stage (learner.shard): none; optimizer (AdamW's moments split over the
// learners); gradients (+ the sum reduce-scattered); parameters (ZeRO-3, planned only).
using ShardStage = learner::ShardStage;

struct PlanOptions {
  std::optional<uint64_t> device_memory;  // --device-memory: bytes of each rank's device (GPU, or RAM on cpu)
  int learners = 0;                       // --learners N: overrides cluster.learners (0 = the config's)
  std::optional<ShardStage> shard;        // --shard STAGE (else learner.shard)
};

// One role on one rank. Bytes by kind; `device` is on the rank's device (policy.device: host RAM on
// cpu, GPU memory on cuda), `host` the rank's host memory on top of it (cuda's host mirror, the
// AdamW state, the offload store and sync buffers; 0 on cpu, where all of it is `device`).
struct PlanRow {
  std::string role;  // learner, generator, env_worker, coordinator
  int index = 0;     // among its role
  int rank = 0;      // the MPI rank (learners, generators, env workers in that order; the coordinator on 0)
  uint64_t weights = 0, gradients = 0, optimizer = 0, activations = 0, kv_cache = 0, sync = 0, collectives = 0,
           other = 0;
  uint64_t device = 0, host = 0;
  std::vector<std::string> notes;
  std::string name() const { return role + " " + std::to_string(index) + " (rank " + std::to_string(rank) + ")"; }
};

struct MemoryPlan {
  std::string config_file;
  std::string device;              // policy.device
  std::string model;               // where the shape came from
  uint64_t params = 0;             // parameters of the model (every tensor)
  uint64_t trainable = 0;          // what trains (the adapters with LoRA)
  std::string dtype = "fp32";      // weights, gradients and optimizer state
  std::string compute_dtype;       // policy.compute_dtype
  ShardStage shard = ShardStage::none;
  int learners = 1;
  int train_tokens = 0;            // tokens of a learner's largest micro-batch
  int train_sequences = 0;         // sequences a learner trains on per step
  int kv_slots = 0, kv_context = 0;  // a generator's KV cache
  std::optional<uint64_t> capacity;  // the tightest of learner.memory_budget and --device-memory
  std::string capacity_from;         // which one
  std::vector<PlanRow> rows;
  std::vector<std::string> notes;
};

Result<MemoryPlan> plan_memory(const actors::ExperimentConfig& cfg, const std::string& config_file,
                               const PlanOptions& options);

std::string plan_table(const MemoryPlan& plan);
nlohmann::json plan_json(const MemoryPlan& plan);
// The first row over the capacity, as the refusal message ("learner 0 (rank 0) needs 5.1 GiB on cpu,
// 1.1 GiB over learner.memory_budget 4 GiB"); nothing when every row fits or there is no capacity.
std::optional<std::string> plan_overflow(const MemoryPlan& plan);

// "4GiB", "80GB", "512MiB", "1.5 GiB", "1048576": bytes. Binary KiB/MiB/GiB/TiB, decimal kB/MB/GB/TB
// (case-insensitive), B or none for bytes. Errors name `what` and the text.
Result<uint64_t> parse_byte_size(std::string_view text, std::string_view what);
std::string format_bytes(uint64_t bytes);  // "1.23 GiB"

// The budget check of troupe run / troupe validate: 0 when the config has no learner.memory_budget
// and no device memory is given, or every rank fits; else prints the table and the message to
// stderr and returns 2.
int check_memory_budget(const actors::ExperimentConfig& cfg, const std::string& config_file,
                        std::optional<uint64_t> device_memory);

}  // namespace troupe::launch
