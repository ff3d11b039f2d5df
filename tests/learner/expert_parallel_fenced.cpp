// policy.expert_parallel_fenced_2ranks (mpirun -np 2): expert parallelism (policy.moe.expert_parallel
// = 2) on policy.device: cpu_fenced, the device path a GPU takes (weights and gradients in device
// memory the host cannot touch, host mirrors, the backend's moe_ep_* over the group's MPI exchange
// fed host copies), trains the bits of the same run on cpu: the weights, the AdamW moments and every
// step metric, for learners holding every expert (one micro-batch per rank; a token budget whose
// micro-batch counts differ by rank, so idle passes serve the peer, under activation checkpointing
// and with two mini-batches; LoRA adapters on the routed experts; ZeRO-3, whose device arena is
// sparse, each layer gathered with every expert) and for learners holding one block
// each (Model::create_expert_block on the device: its step, the group's forwards for old log-probs
// and the mismatch with their idle forwards, the gathered weights and moments, and a checkpoint of
// them resumed). A backend without an expert-parallel layer is named in the layer's error, and the
// group's collective id bootstrap reports rank 0's failure on every rank.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "troupe/kernels/moe_expert_parallel.h"
#include "troupe/learner/communicator.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/learner/checkpoint_ranges.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/model.h"
#include "random_samples.h"
#include "test_support.h"

using namespace troupe;
using namespace troupe::learner;
using kernels::DeviceKind;

namespace {

struct Case {
  const char* name;
  int budget = 0;              // micro_batch_tokens (0 = one micro-batch per rank)
  bool checkpointing = false;  // activation checkpointing (idle passes recompute each MoE layer's forward)
  int mini_batches = 1;        // 2: old log-probs recomputed and rank 0's samples scored for the mismatch
  bool divide = false;         // each learner holds only its block of experts
  int lora = 0;                // policy.lora.rank (0 = off; adapters on every linear layer and expert)
  bool zero3 = false;          // learner.shard parameters (on the device: its sparse arena, per layer)
};

LearnerConfig config(const Case& k) {
  LearnerConfig c;
  c.max_completion_length = 7;
  c.optimizer.lr = 1e-2f;
  c.optimizer.max_grad_norm = 1.0f;
  c.loss.kl_coef = 0.04f;
  c.loss.entropy_coef = 0.01f;
  c.batch.micro_batch_tokens = k.budget;
  c.batch.num_mini_batches = k.mini_batches;
  c.expert_parallel = 2;
  if (k.zero3) c.shard = ShardStage::parameters;
  return c;
}

policy::ModelConfig model_config(const Case& k, DeviceKind device) {
  policy::ModelConfig mc = test::tiny_model(3, 4);  // MoE layers 0 and 2, 4 experts
  mc.mlp_only_layers = {1};
  mc.activation_checkpointing = k.checkpointing;
  mc.device = device;
  if (k.lora > 0) {
    mc.lora.rank = k.lora;
    mc.lora.alpha = 8;
  }
  return mc;
}

// test::recomputed_batch: with two mini-batches the old log-probs are recomputed with the group.
std::vector<Sample> batch_for(const Case& k, uint64_t seed) { return test::recomputed_batch(seed, k.mini_batches); }

struct Run {
  std::vector<float> weights, exp_avg, exp_avg_sq;  // whole (divided: gathered on rank 0)
  std::vector<double> metrics;
};

Result<policy::Model> make_model(const Case& k, DeviceKind device, int rank, uint64_t seed) {
  const policy::ModelConfig mc = model_config(k, device);
  if (k.divide) return policy::Model::create_expert_block(mc, seed, rank % 2, 2);
  return policy::Model::create(mc, seed);
}

void add_metrics(Run& run, const StepMetrics& m) {
  for (double v : {m.loss.loss, m.loss.pg_loss, m.loss.kl, m.loss.entropy, m.grad_norm, m.mismatch.tokens,
                   m.mismatch.diff_sum})
    run.metrics.push_back(v);
}

// The whole weights and moments: a whole model's own (the moments brought down from the device by
// optimizer()), a divided one's gathered on rank 0.
Status record(Run& run, policy::Model& model, ModelAdapter& adapter, Trainer& tr, Communicator& comm) {
  AdamW moments;
  if (model.expert_shards()) {
    TROUPE_ASSIGN_OR_RETURN(moments, tr.gathered_optimizer());
    run.weights.resize(model.expert_shards()->whole_size);
    TROUPE_TRY(test::gather_divided_weights(model, comm, run.weights));
  } else {
    moments = std::as_const(tr).optimizer();
    run.weights.assign(adapter.params().begin(), adapter.params().end());
  }
  run.exp_avg.assign(moments.exp_avg().begin(), moments.exp_avg().end());
  run.exp_avg_sq.assign(moments.exp_avg_sq().begin(), moments.exp_avg_sq().end());
  return {};
}

// Two GRPO steps on `device`.
Status train(const Case& k, DeviceKind device, Communicator& comm, Run& run) {
  TROUPE_ASSIGN_OR_RETURN(auto model, make_model(k, device, comm.rank(), 11));
  if (model.backend().host_visible() == (device == DeviceKind::cpu_fenced))
    return invalid_input("the model is not on the backend asked for");
  ModelAdapter adapter(model);
  Trainer tr(adapter, config(k), comm);
  for (int s = 0; s < 2; ++s) {
    TROUPE_ASSIGN_OR_RETURN(auto m, tr.train_step(batch_for(k, 42 + s)));
    add_metrics(run, m);
  }
  return record(run, model, adapter, tr, comm);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

int report(Communicator& world, const std::string& what, Status st) {
  if (!st.ok()) std::fprintf(stderr, "rank %d %s: %s\n", world.rank(), what.c_str(), st.error().message.c_str());
  int bad = st.ok() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world.rank() == 0) std::printf("%s -> %s\n", what.c_str(), any ? "FAILED" : "ok");
  return any;
}

Status same_run(const Run& fenced, const Run& cpu, bool root) {
  if (!same_bits(fenced.metrics, cpu.metrics)) return invalid_input("the step metrics differ from cpu's");
  if (!root) return {};  // (divided: the gathered values are rank 0's)
  if (!same_bits(fenced.weights, cpu.weights)) return invalid_input("the weights differ from cpu's");
  if (!same_bits(fenced.exp_avg, cpu.exp_avg) || !same_bits(fenced.exp_avg_sq, cpu.exp_avg_sq))
    return invalid_input("the AdamW moments differ from cpu's");
  return {};
}

int compare(const Case& k, Communicator& world) {
  Run cpu, fenced;
  Status st = train(k, DeviceKind::cpu, world, cpu);
  if (st.ok()) st = train(k, DeviceKind::cpu_fenced, world, fenced);
  if (st.ok()) st = same_run(fenced, cpu, world.rank() == 0);
  return report(world, std::string(k.name) + ": cpu_fenced = cpu bit for bit", st);
}

// Divided learners on cpu_fenced: one step, learner 0 writes the gathered weights and moments as a
// checkpoint, fresh blocks on the device load it and take the second step: the cpu run's bits.
int resume(Communicator& world) {
  namespace fs = std::filesystem;
  const Case k{.name = "resume", .divide = true};
  Run cpu;
  Status st = train(k, DeviceKind::cpu, world, cpu);
  int pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const fs::path dir = fs::temp_directory_path() / ("troupe_ep_fenced_" + std::to_string(pid));
  Run resumed;
  if (st.ok()) st = [&]() -> Status {
    TROUPE_ASSIGN_OR_RETURN(auto first, make_model(k, DeviceKind::cpu_fenced, world.rank(), 11));
    ModelAdapter a(first);
    Trainer tr(a, config(k), world);
    TROUPE_ASSIGN_OR_RETURN(auto m, tr.train_step(batch_for(k, 42)));
    add_metrics(resumed, m);
    TROUPE_ASSIGN_OR_RETURN(const std::string latest, test::save_gathered_checkpoint(first, tr, world, dir.string()));
    TROUPE_ASSIGN_OR_RETURN(auto fresh, make_model(k, DeviceKind::cpu_fenced, world.rank(), 99));
    ModelAdapter b(fresh);
    Trainer again(b, config(k), world);
    const policy::ExpertShardLayout& layout = *fresh.expert_shards();
    AdamW loaded_moments(fresh.params().size());
    TROUPE_ASSIGN_OR_RETURN(auto data, load_checkpoint_ranges(latest, layout.whole_table, held_ranges(layout),
                                                              fresh.params(), loaded_moments));
    TROUPE_TRY(again.load_optimizer_share(std::move(loaded_moments)));
    TROUPE_TRY(again.load_state_json(data.trainer_state));
    TROUPE_ASSIGN_OR_RETURN(auto second, again.train_step(batch_for(k, 43)));
    add_metrics(resumed, second);
    return record(resumed, fresh, b, again, world);
  }();
  if (st.ok()) st = same_run(resumed, cpu, world.rank() == 0);
  (void)world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
  return report(world, "divided on cpu_fenced, checkpoint after step 1, resumed on fresh blocks = cpu's 2 steps", st);
}

// The backend table's default layer (a backend that has none) fails naming the backend and the key.
int no_layer(Communicator& world) {
  const kernels::Backend& be = kernels::cpu_fenced_backend();
  kernels::MoeConfig cfg;
  const Status st = be.Backend::moe_ep_serve_forward(kernels::MoeWeights{}, cfg, kernels::MoeExpertGroup{});
  const std::string want = "cpu_fenced backend: no expert-parallel MoE layer (policy.moe.expert_parallel)";
  return report(world, "a backend without the layer is named",
                !st.ok() && st.error().message.find(want) != std::string::npos
                    ? Status{}
                    : invalid_input("expected '" + want + "', got " + (st.ok() ? "success" : st.error().message)));
}

// The group's id bootstrap (share_collective_id): rank 0's bytes reach every rank; a rank 0 that
// could not make the id keeps its own error and every other rank gets one naming rank 0 instead of
// waiting for bytes that never come.
int id_bootstrap(Communicator& world) {
  const bool root = world.rank() == 0;
  const std::vector<uint8_t> bytes = {1, 2, 3, 4, 5, 6, 7};
  Result<std::vector<uint8_t>> made = root ? bytes : std::vector<uint8_t>();
  auto got = learner::share_collective_id(made, world);
  Status st = got.ok() && *got == bytes ? Status{} : invalid_input("the id's bytes did not arrive");
  const std::string rank0 = "rank 0 could not make the collective id";
  made = root ? Result<std::vector<uint8_t>>(invalid_input(rank0)) : std::vector<uint8_t>();
  got = learner::share_collective_id(made, world);
  const std::string want = root ? rank0 : "rank 0 of 2 could not make the collective id";
  if (st.ok() && (got.ok() || got.error().message.find(want) == std::string::npos))
    st = invalid_input("expected an error with '" + want + "', got " + (got.ok() ? "an id" : got.error().message));
  return report(world, "the collective id, or rank 0's failure to make it, reaches every rank", st);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    auto world_comm = test::mpi_world_or_abort();
    Communicator& world = *world_comm;
    if (world.size() != 2) {
      if (world.rank() == 0) std::fprintf(stderr, "run with mpirun -np 2 (got %d ranks)\n", world.size());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    bad |= compare({.name = "every expert on each learner, one micro-batch per rank"}, world);
    bad |= compare({.name = "every expert, token budget 9 (idle passes), activation checkpointing, 2 mini-batches",
                    .budget = 9, .checkpointing = true, .mini_batches = 2},
                   world);
    bad |= compare({.name = "LoRA adapters on every linear layer and expert, token budget 9", .budget = 9, .lora = 4},
                   world);
    bad |= compare({.name = "every expert, learner.shard parameters (the device's sparse arena gathered per layer), "
                            "token budget 9 (idle passes), activation checkpointing",
                    .budget = 9, .checkpointing = true, .zero3 = true},
                   world);
    bad |= compare({.name = "divided blocks, one micro-batch per rank", .divide = true}, world);
    bad |= compare({.name = "divided blocks, token budget 9 (idle passes), activation checkpointing, 2 mini-batches "
                            "(idle forwards of the mismatch)",
                    .budget = 9, .checkpointing = true, .mini_batches = 2, .divide = true},
                   world);
    bad |= resume(world);
    bad |= no_layer(world);
    bad |= id_bootstrap(world);
  }
  MPI_Finalize();
  return bad;
}
