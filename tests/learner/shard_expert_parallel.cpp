// learner.shard_expert_parallel_2ranks (mpirun -np 2): GRPO steps of the tiny MoE policy model with
// policy.moe.expert_parallel = 2 and learner.shard: parameters (ZeRO-3: each layer gathered from the
// shards, its MoE experts split over the ranks, the routed rows exchanged over the group) equal the
// expert-parallel steps with shard none bit for bit (the gradient sums run in the same order), and the
// plain data-parallel steps of the same global batch: bit for bit with one micro-batch per rank, within
// 1e-6 with several (the micro-batches' GEMMs then differ from data parallelism's in their row count, so
// their sums round differently; expert parallelism alone does the same). With a token budget the ranks
// run different micro-batch counts, so one serves its peer's rows in idle passes that also take part in
// every gather and reduce-scatter; with activation checkpointing those recompute each MoE layer's
// forward; with the prefetch off every collective blocks. Each case also keeps the weights sharded
// between steps (ParamsAtRest::shard) and gathers them at the end.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "troupe/learner/trainer.h"
#include "troupe/policy/model.h"
#include "random_samples.h"
#include "test_support.h"

using namespace troupe;
using namespace troupe::learner;

namespace {

struct Case {
  const char* name;
  int budget;          // micro_batch_tokens (0 = one micro-batch per rank)
  bool checkpointing;  // activation checkpointing
  bool prefetch;       // ParamShards' prefetch
  bool exact_vs_dp;    // bit for bit against plain data parallelism too
};

struct Run {
  int ep;
  ShardStage shard;
};

policy::ModelConfig tiny_moe(bool checkpointing) {
  policy::ModelConfig mc = test::tiny_model(3, 4);
  mc.mlp_only_layers = {1};
  mc.activation_checkpointing = checkpointing;
  return mc;
}

// Three GRPO steps; the whole parameters after them and the losses.
Status train(const Case& k, const Run& run, Communicator& comm, std::vector<float>& params, std::vector<double>& losses) {
  auto m = policy::Model::create(tiny_moe(k.checkpointing), 11);
  if (!m.ok()) return m.error();
  ModelAdapter adapter(*m);
  LearnerConfig c;
  c.max_completion_length = 7;
  c.optimizer.lr = 1e-2f;
  c.optimizer.max_grad_norm = 1.0f;
  c.loss.kl_coef = 0.04f;
  c.loss.entropy_coef = 0.01f;
  c.batch.micro_batch_tokens = k.budget;
  c.expert_parallel = run.ep;
  c.shard = run.shard;
  Trainer tr(adapter, c, comm);
  tr.set_shard_prefetch(k.prefetch);
  if (run.shard == ShardStage::parameters) tr.set_params_between_steps(ParamsAtRest::shard);
  losses.clear();
  for (int s = 0; s < 3; ++s) {
    TROUPE_ASSIGN_OR_RETURN(auto r, tr.train_step(test::make_batch(42 + s, 12, 32)));
    losses.push_back(r.loss.loss);
  }
  TROUPE_TRY(tr.gather_params());
  params.assign(adapter.params().begin(), adapter.params().end());
  return {};
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int compare(const Case& k, Communicator& world) {
  const Run runs[3] = {{2, ShardStage::parameters}, {2, ShardStage::none}, {1, ShardStage::none}};
  const char* names[3] = {"EP 2 + shard parameters", "EP 2", "data parallel"};
  std::vector<float> p[3];
  std::vector<double> l[3];
  int bad = 0;
  for (int i = 0; i < 3; ++i)
    if (Status st = train(k, runs[i], world, p[i], l[i]); !st.ok()) {
      std::fprintf(stderr, "rank %d %s, %s: %s\n", world.rank(), k.name, names[i], st.error().message.c_str());
      bad = 1;
    }
  const bool vs_ep = same_bits(p[0], p[1]) && l[0] == l[1], vs_dp_bits = same_bits(p[0], p[2]) && l[0] == l[2];
  const double vs_dp = max_diff(p[0], p[2]);
  double loss_gap = l[0].size() == l[2].size() ? 0.0 : INFINITY;
  for (size_t s = 0; s < l[0].size() && s < l[2].size(); ++s)
    loss_gap = std::max(loss_gap, std::abs(l[0][s] - l[2][s]) / (1 + std::abs(l[2][s])));
  if (!vs_ep || (k.exact_vs_dp && !vs_dp_bits) || vs_dp > 1e-6 || loss_gap > 1e-6) bad = 1;
  if (world.rank() == 0)
    std::printf("%s: EP 2 + shard parameters vs EP 2: %s; vs data parallel: max |dparam| = %.3g (%s), loss gap %.3g "
                "-> %s\n", k.name, vs_ep ? "bit-identical" : "DIFFERENT", vs_dp,
                vs_dp_bits ? "bit-identical" : "not bit-identical", loss_gap, bad ? "MISMATCH" : "ok");
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    auto world_comm = test::mpi_world_or_abort();
    Communicator& world = *world_comm;
    if (world.size() != 2) {
      if (world.rank() == 0) std::fprintf(stderr, "learner.shard_expert_parallel_2ranks runs on 2 ranks\n");
      bad = 1;
    } else {
      bad |= compare({"one micro-batch per rank", 0, false, true, true}, world);
      bad |= compare({"one micro-batch per rank, no prefetch", 0, false, false, true}, world);
      bad |= compare({"token budget 9 (micro-batch counts differ by rank)", 9, false, true, false}, world);
      bad |= compare({"activation checkpointing, token budget 12", 12, true, true, false}, world);
      bad |= compare({"activation checkpointing, token budget 9, no prefetch", 9, true, false, false}, world);
    }
    int any = bad;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    bad = any;
  }
  MPI_Finalize();
  return bad;
}
