// LoRA under data parallelism (mpirun -np 2): the adapters' update (all_linear on a small MoE model:
// attention, a dense MLP, every routed expert) of a Trainer that shards each mini-batch over the
// ranks equals a single-rank Trainer's on the whole batch (as learner.dp_invariance for whole
// models), and the frozen base stays bit for bit. With
// policy.lora.dropout > 0 the masks depend on the rank and micro-batch, so there the check is that
// two runs of the same layout give the same bits on every rank. Exits non-zero on any mismatch.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "troupe/learner/trainer.h"
#include "troupe/policy/model.h"
#include "random_samples.h"
#include "test_support.h"

using namespace troupe;
using namespace troupe::learner;

namespace {

using test::make_batch;

LearnerConfig config(int micro) {
  LearnerConfig c;
  c.max_completion_length = 7;
  c.optimizer.lr = 1e-2f;
  c.optimizer.max_grad_norm = 1.0f;
  c.loss.kl_coef = 0.04f;
  c.batch.num_mini_batches = 2;
  c.batch.num_iterations = 2;
  c.batch.micro_batch_size = micro;
  c.batch.shuffle = true;
  c.seed = 5;
  return c;
}

policy::ModelConfig model_config(float dropout) {
  policy::ModelConfig mc = test::tiny_model(2);
  mc.lora.rank = 4;
  mc.lora.alpha = 8;
  mc.lora.dropout = dropout;
  if (dropout > 0) {  // dropout on a dense model (the routed experts' adapters take none)
    mc.family = policy::ModelFamily::qwen3;
    mc.num_experts = 0;
  } else {  // a qwen3_moe with one dense layer: adapters on attention, the dense MLP and every expert
    mc.num_experts = 4;
    mc.num_experts_per_tok = 2;
    mc.moe_intermediate_size = 16;
    mc.mlp_only_layers = {0};
  }
  return mc;
}

struct Run {
  std::vector<float> adapters, base;
  double loss = 0;
  Status status;
};

// Two train steps of a fresh LoRA model (seed 11) over comm.
Run train(Communicator& comm, int micro, float dropout) {
  Run out;
  auto m = policy::Model::create(model_config(dropout), 11);
  if (!m.ok()) {
    out.status = m.error();
    return out;
  }
  ModelAdapter adapter(*m);
  Trainer tr(adapter, config(micro), comm);
  const auto batch = make_batch(42, 12, 32);
  for (int s = 0; s < 2; ++s) {
    auto r = tr.train_step(batch);
    if (!r.ok()) {
      out.status = r.error();
      return out;
    }
    out.loss = r->loss.loss;
  }
  out.adapters.assign(m->params().begin(), m->params().end());
  out.base.assign(m->base_params().begin(), m->base_params().end());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    auto world_comm = test::mpi_world_or_abort();
    Communicator& world = *world_comm;
    LocalCommunicator local;
    // Without dropout: 2 ranks (micro-batches of 2) == 1 rank (whole mini-batches).
    const Run dp = train(world, 2, 0.0f), one = train(local, 0, 0.0f);
    const auto fresh = policy::Model::create(model_config(0.0f), 11);
    double worst = 0;
    for (size_t i = 0; i < dp.adapters.size() && i < one.adapters.size(); ++i)
      worst = std::max(worst, std::abs(double(dp.adapters[i]) - one.adapters[i]));
    const bool base_ok = fresh.ok() && same_bits(dp.base, std::vector<float>(fresh->base_params().begin(),
                                                                              fresh->base_params().end()));
    if (!dp.status.ok() || !one.status.ok() || dp.adapters.size() != one.adapters.size() || dp.adapters.empty() ||
        worst > 2e-4 || std::abs(dp.loss - one.loss) > 1e-6 * (1 + std::abs(one.loss)) || !base_ok)
      bad = 1;
    if (world.rank() == 0)
      std::printf("LoRA rank 4 (MoE, experts included): %d ranks vs 1 rank: max |dadapter| = %.3g (tol 2e-4), loss %.9g vs %.9g, base %s -> %s\n",
                  world.size(), worst, dp.loss, one.loss, base_ok ? "unchanged" : "CHANGED", bad ? "MISMATCH" : "ok");
    // With dropout: the same layout twice gives the same bits (and differs from no dropout).
    const Run d1 = train(world, 2, 0.2f), d2 = train(world, 2, 0.2f);
    const bool drop_ok = d1.status.ok() && d2.status.ok() && same_bits(d1.adapters, d2.adapters) &&
                         d1.loss == d2.loss && !same_bits(d1.adapters, dp.adapters);
    if (!drop_ok) bad = 1;
    if (world.rank() == 0)
      std::printf("LoRA dropout 0.2, %d ranks, twice: %s\n", world.size(), drop_ok ? "bit-identical" : "MISMATCH");
    for (const Run* r : {&dp, &one, &d1, &d2})
      if (!r->status.ok()) std::fprintf(stderr, "rank %d: %s\n", world.rank(), r->status.error().message.c_str());
    int any = bad;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    bad = any;
  }
  MPI_Finalize();
  return bad;
}
