// policy.expert_parallel_memory_2ranks / _4ranks (mpirun -np 2 / 4): learners whose models hold
// only their block of experts (policy::Model::slice_experts, policy.moe.expert_parallel = 2; on 4
// ranks data-parallel 2 x EP 2) train the bits of learners that hold every expert with the same
// expert parallelism: the whole weights gathered on learner 0 (what the weight sync sends and a
// checkpoint writes) and the step metrics equal, bit for bit, and with one micro-batch per rank
// they equal plain data parallelism (E = 1) bit for bit on 2 ranks, and E = world size does on 4.
// Each rank's training state (learner/state_bytes) is the whole model's less the other blocks'
// parameters, gradients and both moments, exactly. A checkpoint written from the gathered weights
// and moments resumes the divided run bit for bit (each learner reading only its own values,
// load_checkpoint_ranges), and resumes at another layout (every expert on every rank; E = world
// size) as the whole-model run resumed from it does. Refusals: a sliced
// model's forward without its group, learner.shard beside it, a block count not dividing the experts.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "troupe/learner/checkpoint.h"
#include "troupe/learner/checkpoint_ranges.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/model.h"
#include "random_samples.h"
#include "test_support.h"

using namespace troupe;
using namespace troupe::learner;

namespace {

struct Case {
  const char* name;
  int budget = 0;              // micro_batch_tokens (0 = one micro-batch per rank)
  bool checkpointing = false;  // activation checkpointing
  int mini_batches = 1;        // 2: old log-probs recomputed and the mismatch scored in forwards of their own
};

LearnerConfig config(const Case& k, int ep) {
  LearnerConfig c;
  c.max_completion_length = 7;
  c.optimizer.lr = 1e-2f;
  c.optimizer.max_grad_norm = 1.0f;
  c.loss.kl_coef = 0.04f;
  c.loss.entropy_coef = 0.01f;
  c.batch.micro_batch_tokens = k.budget;
  c.batch.num_mini_batches = k.mini_batches;
  c.expert_parallel = ep;
  return c;
}

policy::ModelConfig tiny_moe(bool checkpointing) {
  policy::ModelConfig mc = test::tiny_model(3, 4);  // MoE layers 0 and 2, 4 experts of (16, 16)
  mc.mlp_only_layers = {1};
  mc.activation_checkpointing = checkpointing;
  return mc;
}

// test::recomputed_batch: with two mini-batches the old log-probs are recomputed with the group.
std::vector<Sample> batch_for(const Case& k, uint64_t seed) { return test::recomputed_batch(seed, k.mini_batches); }

struct Run {
  std::vector<float> whole;    // the whole weights after the steps (learner 0; every rank without division)
  std::vector<double> metrics;  // loss, pg_loss, kl, entropy, grad_norm, lr, mismatch tokens of each step
  size_t state_bytes = 0;
};

void add_metrics(Run& run, const StepMetrics& m) {
  for (double v : {m.loss.loss, m.loss.pg_loss, m.loss.kl, m.loss.entropy, m.grad_norm, m.lr, m.mismatch.tokens,
                   m.mismatch.diff_sum})
    run.metrics.push_back(v);
}

// Two steps with E = ep; divide: the model holds only this rank's block of experts.
Status train(const Case& k, Communicator& comm, int ep, bool divide, Run& run) {
  auto whole = policy::Model::create(tiny_moe(k.checkpointing), 11);
  if (!whole.ok()) return whole.error();
  policy::Model model = std::move(*whole);
  if (divide) {
    TROUPE_ASSIGN_OR_RETURN(model, model.slice_experts(comm.rank() % ep, ep));
  }
  ModelAdapter adapter(model);
  Trainer tr(adapter, config(k, ep), comm);
  for (int s = 0; s < 2; ++s) {
    TROUPE_ASSIGN_OR_RETURN(auto r, tr.train_step(batch_for(k, 42 + s)));
    add_metrics(run, r);
  }
  run.state_bytes = tr.state_bytes();
  if (divide) {
    run.whole.resize(model.expert_shards()->whole_size);
    return test::gather_divided_weights(model, comm, run.whole);
  }
  run.whole.assign(adapter.params().begin(), adapter.params().end());
  return {};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

int report(Communicator& world, const std::string& what, Status st) {
  if (!st.ok()) std::fprintf(stderr, "rank %d %s: %s\n", world.rank(), what.c_str(), st.error().message.c_str());
  int bad = st.ok() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world.rank() == 0) std::printf("%s -> %s\n", what.c_str(), any ? "FAILED" : "ok");
  return any;
}

// Divided vs every expert on every rank, E = 2: the same bits; the state bytes less by the formula.
int compare(const Case& k, Communicator& world) {
  Run held, divided, dp;
  Status st = train(k, world, 2, false, held);
  if (st.ok()) st = train(k, world, 2, true, divided);
  if (st.ok() && k.budget == 0 && k.mini_batches == 1 && world.size() == 2) st = train(k, world, 1, false, dp);
  if (st.ok() && world.rank() == 0 && !same_bits(divided.whole, held.whole))
    st = invalid_input("the gathered weights differ from the whole-model EP run's");
  if (st.ok() && !same_bits(divided.metrics, held.metrics))
    st = invalid_input("the step metrics differ from the whole-model EP run's");
  if (st.ok() && !dp.whole.empty() && world.rank() == 0 && !same_bits(divided.whole, dp.whole))
    st = invalid_input("the gathered weights differ from the data-parallel (E = 1) run's");
  if (st.ok() && !dp.whole.empty() && !same_bits(divided.metrics, dp.metrics))
    st = invalid_input("the step metrics differ from the data-parallel (E = 1) run's");
  // 2 MoE layers x (gate, up, down) x the other rank's 2 experts of 16 x 16 floats, held 4 times
  // over (weights, gradients, both AdamW moments), 4 bytes each.
  const size_t less = 2 * 3 * 2 * 16 * 16 * 4 * sizeof(float);
  if (st.ok() && held.state_bytes - divided.state_bytes != less)
    st = invalid_input("state_bytes " + std::to_string(divided.state_bytes) + " vs the whole model's " +
                       std::to_string(held.state_bytes) + ": expected " + std::to_string(less) + " less");
  if (world.rank() == 0 && st.ok())
    std::printf("  state_bytes per rank: %zu of %zu (%.3f)\n", divided.state_bytes, held.state_bytes,
                double(divided.state_bytes) / double(held.state_bytes));
  return report(world, std::string(k.name) + ": divided = held bit for bit" + (dp.whole.empty() ? "" : ", = E 1"), st);
}

// On 4 ranks with one micro-batch per rank, E = 4 divided (each expert's group sums its 4 ranks'
// rows in rank order) is plain data parallelism's ordered all-reduce, bit for bit.
int ep_world(Communicator& world) {
  const Case k{"E = world size"};
  Run divided, dp;
  Status st = train(k, world, world.size(), true, divided);
  if (st.ok()) st = train(k, world, 1, false, dp);
  if (st.ok() && world.rank() == 0 && !same_bits(divided.whole, dp.whole))
    st = invalid_input("the gathered weights differ from the data-parallel run's");
  if (st.ok() && !same_bits(divided.metrics, dp.metrics)) st = invalid_input("the step metrics differ");
  return report(world, "E = " + std::to_string(world.size()) + " divided = E 1 bit for bit", st);
}

// Loads a checkpoint into a fresh trainer of E = ep (divided: its own values alone, as a divided
// learner of troupe run resumes, load_checkpoint_ranges; else whole) and takes one step.
Status resume_step(const std::string& latest, Communicator& world, int ep, bool divide, std::vector<float>& out) {
  const Case k{"resume", 0};
  auto fresh = policy::Model::create(tiny_moe(false), 99);
  if (!fresh.ok()) return fresh.error();
  policy::Model model = std::move(*fresh);
  if (divide) {
    TROUPE_ASSIGN_OR_RETURN(model, model.slice_experts(world.rank() % ep, ep));
  }
  ModelAdapter a(model);
  Trainer tr(a, config(k, ep), world);
  AdamW moments(model.params().size());
  CheckpointData data;
  if (divide) {
    const policy::ExpertShardLayout& layout = *model.expert_shards();
    TROUPE_ASSIGN_OR_RETURN(data, load_checkpoint_ranges(latest, layout.whole_table, held_ranges(layout), model.params(),
                                                         moments));
    TROUPE_TRY(tr.load_optimizer_share(std::move(moments)));
  } else {
    TROUPE_ASSIGN_OR_RETURN(data, load_checkpoint(latest, model.tensors(), moments));
    TROUPE_ASSIGN_OR_RETURN(auto loaded, policy::io::load_model(latest));
    TROUPE_TRY(model.set_params(loaded.model.params()));
    TROUPE_TRY(tr.load_optimizer(std::move(moments)));
  }
  TROUPE_TRY(tr.load_state_json(data.trainer_state));
  auto r = tr.train_step(test::make_batch(43, 12, 32));
  if (!r.ok()) return r.error();
  if (divide) {
    out.resize(model.expert_shards()->whole_size);
    return test::gather_divided_weights(model, world, out);
  }
  out.assign(a.params().begin(), a.params().end());
  return {};
}

// One divided step, learner 0 writes the gathered weights and moments as the whole model's
// checkpoint; resumed divided it goes on as the straight run; resumed at E = world size divided it
// goes on as the whole-model data-parallel run resumed from it (one micro-batch per rank).
int resume(Communicator& world) {
  namespace fs = std::filesystem;
  const Case k{"resume", 0};
  Run straight;
  Status st = train(k, world, 2, true, straight);
  int pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const fs::path dir = fs::temp_directory_path() / ("troupe_ep_memory_" + std::to_string(pid));
  std::string latest;
  if (st.ok()) st = [&]() -> Status {
    auto created = policy::Model::create(tiny_moe(false), 11);
    if (!created.ok()) return created.error();
    TROUPE_ASSIGN_OR_RETURN(auto model, created->slice_experts(world.rank() % 2, 2));
    ModelAdapter a(model);
    Trainer tr(a, config(k, 2), world);
    auto r = tr.train_step(test::make_batch(42, 12, 32));
    if (!r.ok()) return r.error();
    TROUPE_ASSIGN_OR_RETURN(latest, test::save_gathered_checkpoint(model, tr, world, dir.string()));
    return {};
  }();
  std::vector<float> again, wide, dp;
  if (st.ok()) st = resume_step(latest, world, 2, true, again);
  if (st.ok() && world.rank() == 0 && !same_bits(again, straight.whole))
    st = invalid_input("resumed divided, the weights differ from the straight run's");
  if (st.ok()) st = resume_step(latest, world, world.size(), true, wide);
  if (st.ok()) st = resume_step(latest, world, 1, false, dp);
  if (st.ok() && world.rank() == 0 && !same_bits(wide, dp))
    st = invalid_input("resumed at E = " + std::to_string(world.size()) +
                       " divided, the weights differ from the data-parallel resume's");
  (void)world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
  return report(world, "checkpoint of the gathered state: resumed divided = straight, at E = " +
                           std::to_string(world.size()) + " = E 1 resumed, bit for bit", st);
}

Status expect_error(Status st, const std::string& want) {
  if (!st.ok() && st.error().message.find(want) != std::string::npos) return {};
  return invalid_input("expected an error with '" + want + "', got " + (st.ok() ? "success" : st.error().message));
}

int refusals(Communicator& world) {
  Status st = [&]() -> Status {
    auto created = policy::Model::create(tiny_moe(false), 11);
    if (!created.ok()) return created.error();
    auto three = created->slice_experts(0, 3);
    TROUPE_TRY(expect_error(three.ok() ? Status{} : three.error(), "expert block 0 of 3 of num_experts = 4"));
    TROUPE_ASSIGN_OR_RETURN(auto model, created->slice_experts(world.rank() % 2, 2));
    std::vector<float> logits(4 * 32);
    policy::PackedBatch b;
    b.tokens = {1, 2, 3, 4};
    b.cu_seqlens = {0, 4};
    TROUPE_TRY(expect_error(model.forward_logits(b, logits.data()), "its forwards run with the expert-parallel group"));
    ModelAdapter a(model);
    Case k{"shard"};
    LearnerConfig c = config(k, 2);
    c.shard = ShardStage::optimizer;
    Trainer tr(a, c, world);
    auto r = tr.train_step(test::make_batch(42, 12, 32));
    return expect_error(r.ok() ? Status{} : r.error(), "with learner.shard: optimizer");
  }();
  return report(world, "refused: 3 blocks of 4 experts, a forward without the group, learner.shard beside it", st);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    auto world_comm = test::mpi_world_or_abort();
    Communicator& world = *world_comm;
    bad |= compare({"one micro-batch per rank"}, world);
    bad |= compare({"token budget 9 (micro-batch counts differ by rank)", 9}, world);
    bad |= compare({"activation checkpointing, token budget 12", 12, true}, world);
    bad |= compare({"two mini-batches (old log-probs recomputed, mismatch scored on rank 0's samples)", 0, false, 2},
                   world);
    if (world.size() == 4) bad |= ep_world(world);
    bad |= resume(world);
    bad |= refusals(world);
  }
  MPI_Finalize();
  return bad;
}
