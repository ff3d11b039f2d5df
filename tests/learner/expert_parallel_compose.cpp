// policy.expert_parallel_distill_2ranks, _lora_2ranks, _stream_2ranks and
// policy.expert_parallel_compose_4ranks, learner.shard_expert_parallel_distill_2ranks, _lora_2ranks,
// _stream_2ranks and _compose_4ranks (mpirun -np 2 / 4; the argument picks the group, "all" runs the
// first three, "shard_all" the learner.shard ones): policy.moe.expert_parallel = 2 beside distillation (distill.teacher: the reverse-KL
// term alone, and with the top-k pass, a forward/backward of its own that idle ranks serve too),
// LoRA (adapters on attention, the dense MLP and every routed expert; dropout on the non-expert
// adapters with the mismatch scored by a forward of its own) and streamed parts (Trainer::accumulate
// / finish_accumulated, rollout.async_chunks > 1: an empty part, parts whose micro-batch counts
// differ by rank), each against the data-parallel run (E = 1) of the same global batch on the same
// ranks. Bit for bit where the sums run in the same order: 2 ranks with one micro-batch per rank
// and one forward/backward pair per micro-batch (reverse KL alone, LoRA); within 1e-6 otherwise,
// because an owned expert's gradient then adds the group's rows pass by pass ((((d0 + d1) + t0) + t1)
// for the top-k pass t, (((d0 + d1) + d0') + d1') over streamed parts) where data parallelism sums each
// rank's own passes first ((d0 + t0) + (d1 + t1)). Models holding one block of experts
// (slice_experts) are compared the same way, their whole weights gathered on learner 0; with
// activation checkpointing the idle passes recompute each MoE layer's forward as the peers do.
// The shard_ groups run the same cases with learner.shard: parameters (ZeRO-3: LoRA's adapters, a
// distillation step and a streamed step take the whole trainable buffer gathered for the step, so
// each rank's passes are those of learner.shard none) and require the expert-parallel run with shard
// none bit for bit as well (the reduce-scatter adds in rank order as the all-reduce does; the norm is
// the same front-to-back sum), then the data-parallel run as above.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
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
  int budget = 0;         // micro_batch_tokens (0 = one micro-batch per rank)
  int topk = -1;          // distill.teacher: -1 off, 0 the reverse-KL term alone, k > 0 with the top-k pass
  int lora = 0;           // policy.lora.rank (0 = off)
  float dropout = 0;      // policy.lora.dropout (on the non-expert adapters)
  bool stream = false;    // the batch in parts through accumulate / finish_accumulated
  bool divide = false;    // each learner's model holds only its block of experts
  bool checkpointing = false;  // activation checkpointing (the idle passes recompute each MoE layer's forward too)
  bool exact = false;     // EP must equal DP bit for bit (2 ranks only)
  bool zero3 = false;     // the EP run with learner.shard: parameters, also equal to EP with shard none bit for bit
  int mini_batches = 1;   // num_mini_batches (> 1: old log-probs recomputed, the mismatch scored before the update)
};

LearnerConfig config(const Case& k, int ep, ShardStage shard) {
  LearnerConfig c;
  c.max_completion_length = 7;
  // (AdamW's update is lr m / (sqrt(v) + eps): where an expert's gradient nearly cancels, another
  // order of the same sums moves it by a fraction of lr, up to 5e-6 seen at lr 1e-2 with the top-k
  // pass; at 1e-3 the parameters after two steps agree within 1e-6)
  c.optimizer.lr = 1e-3f;
  c.optimizer.max_grad_norm = 1.0f;
  c.loss.kl_coef = 0.04f;
  c.loss.entropy_coef = 0.01f;
  c.batch.micro_batch_tokens = k.budget;
  c.batch.num_mini_batches = k.mini_batches;
  c.expert_parallel = ep;
  c.shard = shard;
  c.seed = 5;
  if (k.topk >= 0) {
    c.distill.teacher = "teacher";
    c.distill.coef = 0.7f;
    c.distill.topk = k.topk;
    c.distill.reward_coef = 0.5f;
  }
  return c;
}

policy::ModelConfig model_config(const Case& k) {
  policy::ModelConfig mc = test::tiny_model(3, 4);  // MoE layers 0 and 2, 4 experts
  mc.mlp_only_layers = {1};
  mc.activation_checkpointing = k.checkpointing;
  if (k.lora > 0) {
    mc.lora.rank = k.lora;
    mc.lora.alpha = 8;
    mc.lora.dropout = k.dropout;
    if (k.dropout > 0)  // (the routed experts' adapters take no dropout)
      mc.lora.targets = {policy::LoraTarget::q, policy::LoraTarget::k, policy::LoraTarget::v, policy::LoraTarget::o,
                         policy::LoraTarget::gate, policy::LoraTarget::up, policy::LoraTarget::down};
  }
  return mc;
}

// make_batch's samples, with the teacher's numbers for distillation and the first quarter scored
// for the sampler mismatch.
std::vector<Sample> batch_for(const Case& k, uint64_t seed) {
  auto b = test::make_batch(seed, 12, 32);
  std::mt19937_64 rng(seed + 1000);
  std::uniform_int_distribution<int> tok(0, 31);
  std::normal_distribution<float> nd(0, 1);
  for (size_t i = 0; i < b.size(); ++i) {
    Sample& s = b[i];
    s.score_mismatch = i < 3;
    if (k.topk < 0) continue;
    for (size_t j = 0; j < s.completion.size(); ++j) {
      s.teacher_logprobs.push_back(-2.5f + 0.5f * nd(rng));
      for (int t = 0; t < k.topk; ++t) {
        s.teacher_topk_ids.push_back(tok(rng));
        s.teacher_topk_logprobs.push_back(std::log(t == 0 ? 0.5f : 0.2f));
      }
    }
  }
  return b;
}

struct Run {
  std::vector<float> params;    // the trainable arena after the steps (whole; learner 0 only when divided)
  std::vector<double> metrics;  // per step: loss, grad_norm, distill reverse KL and top-k KL, mismatch tokens
};

Result<StepMetrics> one_step(const Case& k, Trainer& tr, const std::vector<Sample>& batch) {
  if (!k.stream) return tr.train_step(batch);
  // parts [0, 5), an empty one, [5, 12): the same parts on every rank
  for (auto [a, b] : {std::pair{0, 5}, std::pair{5, 5}, std::pair{5, 12}})
    TROUPE_TRY(tr.accumulate(std::vector<Sample>(batch.begin() + a, batch.begin() + b)));
  return tr.finish_accumulated();
}

Status train(const Case& k, Communicator& comm, int ep, ShardStage shard, Run& run) {
  TROUPE_ASSIGN_OR_RETURN(policy::Model model, policy::Model::create(model_config(k), 11));
  const bool divide = k.divide && ep > 1;
  if (divide) {
    TROUPE_ASSIGN_OR_RETURN(model, model.slice_experts(comm.rank() % ep, ep));
  }
  ModelAdapter adapter(model);
  Trainer tr(adapter, config(k, ep, shard), comm);
  // ZeRO-3 keeps only its shard between the steps (the next step gathers what it needs)
  if (shard == ShardStage::parameters) tr.set_params_between_steps(ParamsAtRest::shard);
  for (int s = 0; s < 2; ++s) {
    TROUPE_ASSIGN_OR_RETURN(auto m, one_step(k, tr, batch_for(k, 42 + s)));
    for (double v : {m.loss.loss, m.grad_norm, m.distill.reverse_kl_sum, m.distill.topk_kl_sum, m.mismatch.tokens})
      run.metrics.push_back(v);
  }
  if (!divide) {
    TROUPE_TRY(tr.gather_params());
    run.params.assign(adapter.params().begin(), adapter.params().end());
    return {};
  }
  run.params.resize(comm.rank() == 0 ? model.expert_shards()->whole_size : 0);
  return test::gather_divided_weights(model, comm, run.params);
}

bool same_params(const Run& a, const Run& b) {
  return a.params.size() == b.params.size() && std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4) == 0;
}

int compare(const Case& k, Communicator& world) {
  Run ep, dp, ep_none;  // ep_none: with k.zero3, the EP run with learner.shard none
  int bad = 0;
  const ShardStage stage = k.zero3 ? ShardStage::parameters : ShardStage::none;
  std::vector<std::pair<Status, const char*>> runs;
  runs.emplace_back(train(k, world, 2, stage, ep), k.zero3 ? "EP + shard parameters" : "EP");
  runs.emplace_back(train(k, world, 1, ShardStage::none, dp), "DP");
  if (k.zero3) runs.emplace_back(train(k, world, 2, ShardStage::none, ep_none), "EP + shard none");
  for (const auto& [st, what] : runs)
    if (!st.ok()) {
      std::fprintf(stderr, "rank %d %s %s: %s\n", world.rank(), k.name, what, st.error().message.c_str());
      bad = 1;
    }
  const bool holds = !(k.divide && world.rank() != 0);  // (a divided run's whole weights are on learner 0)
  const double vs_dp = holds ? test::max_diff(ep.params, dp.params) : 0.0;
  const bool bits = !holds || same_params(ep, dp);
  const bool vs_ep_none = !k.zero3 || (same_params(ep, ep_none) && ep.metrics == ep_none.metrics);
  double metric_diff = ep.metrics.size() == dp.metrics.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < ep.metrics.size() && i < dp.metrics.size(); ++i)
    metric_diff = std::max(metric_diff, std::abs(ep.metrics[i] - dp.metrics[i]) / (1 + std::abs(dp.metrics[i])));
  const bool exact = k.exact && world.size() == 2;
  if (bad || !vs_ep_none || (exact && (!bits || metric_diff != 0)) || vs_dp > 1e-6 || metric_diff > 1e-6) bad = 1;
  if (world.rank() == 0)
    std::printf("%s: EP 2%s on %d ranks%s; vs data-parallel: max |dparam| = %.3g (%s%s), metrics rel %.3g -> %s\n",
                k.name, k.zero3 ? " + shard parameters" : "", world.size(),
                !k.zero3 ? "" : vs_ep_none ? " vs EP 2 + shard none: bit-identical" : " vs EP 2 + shard none: DIFFERENT",
                vs_dp, bits ? "bit-identical" : "not bit-identical", exact ? ", bit for bit required" : "", metric_diff,
                bad ? "MISMATCH" : "ok");
  return bad;
}

int distill(Communicator& world) {
  int bad = 0;
  bad |= compare({.name = "distill: reverse KL, one micro-batch per rank", .topk = 0, .exact = true}, world);
  bad |= compare({.name = "distill: reverse KL + top-2 pass, token budget 9", .budget = 9, .topk = 2}, world);
  bad |= compare({.name = "distill: top-2 pass, divided experts, token budget 9", .budget = 9, .topk = 2,
                  .divide = true}, world);
  bad |= compare({.name = "distill: top-2 pass, activation checkpointing, token budget 9", .budget = 9, .topk = 2,
                  .checkpointing = true}, world);
  return bad;
}

int lora(Communicator& world) {
  int bad = 0;
  bad |= compare({.name = "lora: adapters on every module and expert, one micro-batch per rank", .lora = 4,
                  .exact = true}, world);
  bad |= compare({.name = "lora: token budget 9", .budget = 9, .lora = 4}, world);
  bad |= compare({.name = "lora: activation checkpointing, token budget 9", .budget = 9, .lora = 4,
                  .checkpointing = true}, world);
  bad |= compare({.name = "lora: dropout 0.1 on the non-expert adapters, one micro-batch per rank", .lora = 4,
                  .dropout = 0.1f, .exact = true}, world);
  {  // a model holding one block of experts cannot carry adapters: refused naming the key
    auto m = policy::Model::create(model_config({.name = "", .lora = 4}), 11);
    const std::string why = !m.ok() ? m.error().message : [&]() -> std::string {
      auto sliced = m->slice_experts(world.rank() % 2, 2);
      return sliced.ok() ? "success" : sliced.error().message;
    }();
    if (why.find("policy.moe.expert_parallel") == std::string::npos || why.find("LoRA") == std::string::npos) {
      std::fprintf(stderr, "rank %d: slice_experts of a LoRA model: expected a refusal naming the key, got %s\n",
                   world.rank(), why.c_str());
      bad = 1;
    }
  }
  return bad;
}

int stream(Communicator& world) {
  int bad = 0;
  bad |= compare({.name = "stream: 3 parts (one empty), one micro-batch per rank and part", .stream = true}, world);
  bad |= compare({.name = "stream: 3 parts, token budget 9", .budget = 9, .stream = true}, world);
  bad |= compare({.name = "stream: 3 parts, divided experts, token budget 9", .budget = 9, .stream = true,
                  .divide = true}, world);
  bad |= compare({.name = "stream: 3 parts with distillation's top-2 pass", .budget = 9, .topk = 2, .stream = true},
                 world);
  return bad;
}

// learner.shard: parameters beside each, the cases above that hold every expert (a model holding one
// block of experts is refused with a shard stage): ZeRO-3 must equal EP with shard none bit for bit.
int shard_distill(Communicator& world) {
  int bad = 0;
  bad |= compare({.name = "shard parameters, distill: reverse KL, one micro-batch per rank", .topk = 0, .exact = true,
                  .zero3 = true}, world);
  bad |= compare({.name = "shard parameters, distill: reverse KL + top-2 pass, token budget 9", .budget = 9, .topk = 2,
                  .zero3 = true}, world);
  bad |= compare({.name = "shard parameters, distill: top-2 pass, activation checkpointing, token budget 9",
                  .budget = 9, .topk = 2, .checkpointing = true, .zero3 = true}, world);
  bad |= compare({.name = "shard parameters, distill: top-2 pass, two mini-batches (old log-probs recomputed, the "
                  "mismatch scored before the update)", .budget = 9, .topk = 2, .zero3 = true, .mini_batches = 2},
                 world);
  return bad;
}

int shard_lora(Communicator& world) {
  int bad = 0;
  bad |= compare({.name = "shard parameters, lora: adapters on every module and expert, one micro-batch per rank",
                  .lora = 4, .exact = true, .zero3 = true}, world);
  bad |= compare({.name = "shard parameters, lora: token budget 9", .budget = 9, .lora = 4, .zero3 = true}, world);
  bad |= compare({.name = "shard parameters, lora: dropout 0.1 on the non-expert adapters, one micro-batch per rank",
                  .lora = 4, .dropout = 0.1f, .exact = true, .zero3 = true}, world);
  return bad;
}

int shard_stream(Communicator& world) {
  int bad = 0;
  bad |= compare({.name = "shard parameters, stream: 3 parts (one empty), one micro-batch per rank and part",
                  .stream = true, .zero3 = true}, world);
  bad |= compare({.name = "shard parameters, stream: 3 parts, token budget 9, activation checkpointing", .budget = 9,
                  .stream = true, .checkpointing = true, .zero3 = true}, world);
  bad |= compare({.name = "shard parameters, stream: 3 parts with distillation's top-2 pass", .budget = 9, .topk = 2,
                  .stream = true, .zero3 = true}, world);
  bad |= compare({.name = "shard parameters, stream: 3 parts with LoRA, token budget 9", .budget = 9, .lora = 4,
                  .stream = true, .zero3 = true}, world);
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const std::string group = argc > 1 ? argv[1] : "all";
  int bad = 0;
  {
    auto world_comm = test::mpi_world_or_abort();
    Communicator& world = *world_comm;
    const std::pair<const char*, int (*)(Communicator&)> groups[] = {
        {"distill", distill},           {"lora", lora},           {"stream", stream},
        {"shard_distill", shard_distill}, {"shard_lora", shard_lora}, {"shard_stream", shard_stream}};
    bool known = false;
    for (const auto& [name, run] : groups) {
      const bool shard = std::string(name).starts_with("shard_");
      if (group != name && group != (shard ? "shard_all" : "all")) continue;
      known = true;
      bad |= run(world);
    }
    if (!known) {
      if (world.rank() == 0)
        std::fprintf(stderr, "unknown group '%s' (distill, lora, stream, all, shard_distill, shard_lora, shard_stream, "
                     "shard_all)\n", group.c_str());
      bad = 1;
    }
    int any = bad;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    bad = any;
  }
  MPI_Finalize();
  return bad;
}
