// Sharded learners under mpirun (learner.shard): every stage's update must equal the unsharded
// data-parallel update on the same ranks bit for bit (parameters, loss, grad_norm), for the bigram
// model, the tiny MoE policy model and a LoRA model (with and without dropout), GRPO and SFT (ZeRO-3 with and without the
// prefetch); a sharded run resumed into another stage from the gathered optimizer state continues
// bit for bit; the reduce-scatter sums in rank order. Exits non-zero on any rank's mismatch (rank 0 prints each case).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "troupe/base/enum_names.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/model.h"
#include "test_support.h"

using namespace troupe;
using namespace troupe::learner;

namespace {

std::vector<Sample> make_batch(uint64_t seed, int n, int V) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, V - 1), len(1, 7);
  std::normal_distribution<float> nd(0, 1);
  std::vector<Sample> out(static_cast<size_t>(n));
  for (auto& s : out) {
    for (int i = len(rng); i > 0; --i) s.prompt.push_back(tok(rng));
    for (int i = len(rng); i > 0; --i) {
      s.completion.push_back(tok(rng));
      s.ref_logprobs.push_back(-3.0f + 0.3f * nd(rng));
    }
    s.advantage = nd(rng);
  }
  return out;
}

struct Case {
  const char* name;
  Phase phase;
  LossAggMode agg;
  float max_grad_norm;
  int micro_batch_tokens = 0;  // > 0: the ranks' micro-batch counts differ (ZeRO-3's phantom passes)
};

LearnerConfig config(const Case& c, ShardStage stage) {
  LearnerConfig l;
  l.phase = c.phase;
  l.max_completion_length = 7;
  l.optimizer.lr = 1e-2f;
  l.optimizer.weight_decay = 0.01f;
  l.optimizer.max_grad_norm = c.max_grad_norm;
  l.loss.kl_coef = c.phase == Phase::grpo ? 0.04f : 0.0f;
  l.loss.entropy_coef = 0.01f;
  l.loss.agg_mode = c.agg;
  l.batch.num_mini_batches = 2;
  l.batch.num_iterations = c.phase == Phase::grpo ? 2 : 1;
  l.batch.micro_batch_size = 2;
  l.batch.micro_batch_tokens = c.micro_batch_tokens;
  l.batch.shuffle = true;
  l.seed = 5;
  l.shard = stage;
  return l;
}

using MakeModel = std::function<std::unique_ptr<PolicyModel>(std::unique_ptr<policy::Model>&)>;

struct Trace {
  std::vector<float> params;
  std::vector<double> losses, norms;
};

// Two train steps; with `resume_into`, a fresh model and Trainer of that stage take over after the
// first (parameters, gathered optimizer state, trainer state), as a checkpoint and --resume would.
// rest: where learner.shard parameters keeps the weights between steps (gathered to read them).
Result<Trace> run(const MakeModel& make, const Case& c, ShardStage stage, Communicator& comm, int V,
                  std::optional<ShardStage> resume_into = std::nullopt, ParamsAtRest rest = ParamsAtRest::whole,
                  bool prefetch = true) {
  std::unique_ptr<policy::Model> holder;
  auto m = make(holder);
  auto tr = std::make_unique<Trainer>(*m, config(c, stage), comm);
  tr->set_params_between_steps(rest);
  tr->set_shard_prefetch(prefetch);
  Trace t;
  for (int s = 0; s < 2; ++s) {
    if (s == 1 && resume_into) {
      TROUPE_TRY(tr->gather_params());
      TROUPE_ASSIGN_OR_RETURN(AdamW whole, tr->gathered_optimizer());
      const auto state = tr->state_json();
      std::vector<float> p(m->params().begin(), m->params().end());
      tr.reset();
      std::unique_ptr<policy::Model> holder2;
      auto m2 = make(holder2);
      std::copy(p.begin(), p.end(), m2->params().begin());
      tr = std::make_unique<Trainer>(*m2, config(c, *resume_into), comm);
      tr->set_params_between_steps(rest);
      TROUPE_TRY(tr->load_optimizer(std::move(whole)));
      TROUPE_TRY(tr->load_state_json(state));
      m = std::move(m2);
      holder = std::move(holder2);
    }
    TROUPE_ASSIGN_OR_RETURN(auto r, tr->train_step(make_batch(40 + static_cast<uint64_t>(s), 16, V)));
    t.losses.push_back(r.loss.loss);
    t.norms.push_back(r.grad_norm);
  }
  TROUPE_TRY(tr->gather_params());
  t.params.assign(m->params().begin(), m->params().end());
  return t;
}

bool same(const Trace& a, const Trace& b) {
  return a.params.size() == b.params.size() &&
         std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)) == 0 && a.losses == b.losses &&
         a.norms == b.norms;
}

int compare_model(const char* model, const MakeModel& make, int V, Communicator& world) {
  int bad = 0;
  const Case cases[] = {{"grpo token-mean, clipped", Phase::grpo, LossAggMode::token_mean, 0.05f},
                        {"grpo seq-mean-token-mean", Phase::grpo, LossAggMode::seq_mean_token_mean, 1.0f},
                        {"grpo token budget", Phase::grpo, LossAggMode::token_mean, 1.0f, 9},
                        {"sft", Phase::sft, LossAggMode::token_mean, 0.5f}};
  for (const auto& c : cases) {
    auto base = run(make, c, ShardStage::none, world, V);
    if (!base.ok()) {
      std::fprintf(stderr, "rank %d %s %s none: %s\n", world.rank(), model, c.name, base.error().message.c_str());
      return 1;
    }
    struct Variant {
      ShardStage stage;
      std::optional<ShardStage> resume;
      ParamsAtRest rest = ParamsAtRest::whole;
      bool prefetch = true;  // parameters: the next layer's gather started ahead (false: every collective blocks)
    };
    const auto P = ShardStage::parameters;
    for (auto v : {Variant{ShardStage::optimizer, {}}, Variant{ShardStage::gradients, {}},
                   Variant{ShardStage::gradients, ShardStage::optimizer}, Variant{ShardStage::optimizer, ShardStage::none},
                   Variant{ShardStage::none, ShardStage::gradients}, Variant{P, {}}, Variant{P, {}, ParamsAtRest::shard},
                   Variant{P, ShardStage::none, ParamsAtRest::rank0}, Variant{ShardStage::gradients, P, ParamsAtRest::shard},
                   Variant{P, {}, ParamsAtRest::whole, false}}) {
      auto got = run(make, c, v.stage, world, V, v.resume, v.rest, v.prefetch);
      int ok = got.ok() && same(*got, *base);
      if (!got.ok()) std::fprintf(stderr, "rank %d: %s\n", world.rank(), got.error().message.c_str());
      int all = ok;
      MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      if (world.rank() == 0)
        std::printf("%s, %s, %d ranks: shard %s%s%s%s%s == none bit for bit: %s (grad_norm %.9g)\n", model, c.name,
                    world.size(), enum_string(v.stage).c_str(), v.prefetch ? "" : " (no prefetch)", v.rest == ParamsAtRest::shard ? " (shard between steps)" : v.rest == ParamsAtRest::rank0 ? " (whole on rank 0)" : "",
                    v.resume ? ", resumed as " : "", v.resume ? enum_string(*v.resume).c_str() : "", all ? "ok" : "MISMATCH",
                    base->norms.back());
      bad |= !all;
    }
  }
  return bad;
}

// The reduce-scatter's sum is ((b0 + b1) + b2) + ... on each element, whatever MPI does.
int check_reduce_scatter(Communicator& world) {
  const size_t n = 1000;
  auto values = [&](int rank) {
    std::mt19937_64 rng(7 + static_cast<uint64_t>(rank));
    std::normal_distribution<float> nd(0, 1);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng) * (rank % 2 ? 1e4f : 1e-3f);
    return v;
  };
  auto buf = values(world.rank());
  const auto bounds = shard_bounds(n, world.size());
  int ok = world.ordered_allreduce_sum(buf, bounds).ok();
  std::vector<float> want = values(0);
  for (int r = 1; r < world.size(); ++r) {
    auto v = values(r);
    for (size_t i = 0; i < n; ++i) want[i] += v[i];
  }
  ok = ok && std::memcmp(buf.data(), want.data(), n * sizeof(float)) == 0;
  int all = ok;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (world.rank() == 0) std::printf("reduce-scatter in rank order, %d ranks: %s\n", world.size(), all ? "ok" : "MISMATCH");
  return !all;
}

policy::ModelConfig tiny(bool moe, int lora_rank, bool tied = false, bool ckpt = false) {
  policy::ModelConfig mc = test::tiny_model(2);
  mc.tie_word_embeddings = tied;
  mc.activation_checkpointing = ckpt;
  if (moe) {
    mc.num_experts = 4;
    mc.num_experts_per_tok = 2;
    mc.moe_intermediate_size = 16;
    mc.mlp_only_layers = {0};
  }
  mc.lora.rank = lora_rank;
  using T = policy::LoraTarget;
  if (lora_rank > 0) mc.lora.targets = {T::q, T::k, T::v, T::o, T::gate, T::up, T::down};
  return mc;
}

MakeModel policy_model(policy::ModelConfig mc) {
  return [mc](std::unique_ptr<policy::Model>& holder) -> std::unique_ptr<PolicyModel> {
    auto m = policy::Model::create(mc, 11);
    if (!m.ok()) {
      std::fprintf(stderr, "model: %s\n", m.error().message.c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    holder = std::make_unique<policy::Model>(std::move(m.value()));
    return std::make_unique<ModelAdapter>(*holder);
  };
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    auto world_comm = test::mpi_world_or_abort();
    Communicator& world = *world_comm;
    bad |= check_reduce_scatter(world);
    bad |= compare_model("bigram",
                         [](std::unique_ptr<policy::Model>&) -> std::unique_ptr<PolicyModel> {
                           return std::make_unique<BigramModel>(32, 3);
                         },
                         32, world);
    bad |= compare_model("policy::Model (tiny MoE)", policy_model(tiny(true, 0)), 32, world);
    bad |= compare_model("policy::Model (tiny dense, tied head, activation checkpointing)",
                         policy_model(tiny(false, 0, true, true)), 32, world);
    bad |= compare_model("policy::Model (tiny MoE, LoRA r=2)", policy_model(tiny(true, 2)), 32, world);
    policy::ModelConfig dropout = tiny(true, 2);
    dropout.lora.dropout = 0.1f;  // (the masks count each optimizer step's micro-batches from 0, resumed too)
    bad |= compare_model("policy::Model (tiny MoE, LoRA r=2, dropout 0.1)", policy_model(dropout), 32, world);
  }
  MPI_Finalize();
  return bad;
}
