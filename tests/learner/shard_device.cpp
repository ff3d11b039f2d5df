// learner.shard_device_2ranks / _4ranks (mpirun): every ZeRO stage (learner.shard optimizer,
// gradients, parameters) on a model whose trainable arena lives in device memory (policy.device:
// cpu_fenced, the path a GPU takes) steps on the device: the gradients reduce-scattered by the
// device collective (NCCL on cuda; here the host-staged one over MPI, and a counting wrapper of it
// passed as the learners' device collective), the norm chained through the ranks from each
// shard's squares, AdamW on the rank's shard with its shard of the moments, the weights
// all-gathered on the device. With parameters the arena is sparse (device_shards.h): each layer's
// weights are mapped and all-gathered before its forward and backward and unmapped after, its
// gradient reduce-scattered after its backward (with LoRA the adapters' arena stays whole). Each
// run equals plain data parallelism on cpu bit for bit (weights, loss, grad_norm): dense and LoRA,
// GRPO with clipping (also in streamed parts) and SFT, resumed from the gathered moments into
// another stage, and with learner.optimizer_offload (the host step). The step observer sees the
// new weights; the collective calls are counted; a failing device collective is an error naming
// it. A wider model shows what ZeRO-3 maps: the most mapped at once during a step and what stays
// mapped between steps are a fraction of the whole arena, and an op never touches an unmapped page
// (cpu_fenced faults). Exits non-zero on any rank's mismatch (rank 0 prints each case).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "troupe/base/enum_names.h"
#include "troupe/learner/communicator.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/model.h"
#include "random_samples.h"
#include "test_support.h"

using namespace troupe;
using namespace troupe::learner;
using kernels::DeviceKind;

namespace {

struct Case {
  const char* name;
  Phase phase;
  float max_grad_norm;
  int lora = 0;
  bool stream = false;  // the batch in parts (Trainer::accumulate / finish_accumulated, rollout.async_chunks)
  bool wide = false;    // wide_model(): layers of many pages
};

// Six layers of about 40 pages each (hidden 64): whole granules of cpu_fenced's sparse arena to map.
policy::ModelConfig wide_model() {
  policy::ModelConfig mc = test::tiny_model(6);
  mc.hidden_size = 64;
  mc.num_attention_heads = 4;
  mc.num_key_value_heads = 2;
  mc.head_dim = 16;
  mc.intermediate_size = 128;
  return mc;
}

Result<StepMetrics> one_step(const Case& c, Trainer& tr, const std::vector<Sample>& batch) {
  if (!c.stream) return tr.train_step(batch);
  // parts [0, 6), an empty one, [6, 16): the same parts on every rank
  for (auto [a, b] : {std::pair{0, 6}, std::pair{6, 6}, std::pair{6, 16}})
    TROUPE_TRY(tr.accumulate(std::vector<Sample>(batch.begin() + a, batch.begin() + b)));
  return tr.finish_accumulated();
}

LearnerConfig config(const Case& c, ShardStage stage) {
  LearnerConfig l;
  l.phase = c.phase;
  l.max_completion_length = 7;
  l.optimizer.lr = 1e-2f;
  l.optimizer.weight_decay = 0.01f;
  l.optimizer.max_grad_norm = c.max_grad_norm;
  l.loss.kl_coef = c.phase == Phase::grpo ? 0.04f : 0.0f;
  l.loss.entropy_coef = 0.01f;
  l.batch.num_mini_batches = c.stream ? 1 : 2;  // (a streamed batch is one optimizer step)
  l.batch.micro_batch_size = 2;
  l.seed = 5;
  l.shard = stage;
  return l;
}

Result<policy::Model> make_model(const Case& c, DeviceKind device) {
  policy::ModelConfig mc = c.wide ? wide_model() : test::tiny_model(2);
  mc.device = device;
  mc.lora.rank = c.lora;
  if (c.lora > 0) mc.lora.alpha = 8;
  return policy::Model::create(mc, 11);
}

// The learners' device collective as a test sees it: the host-staged one, counting its calls, or
// failing on its n-th reduce-scatter.
class Counted final : public kernels::DeviceCollective {
 public:
  Counted(const kernels::Backend& b, Communicator& comm, int fail_at = -1)
      : inner_(staged_device_collective(b, comm)), fail_at_(fail_at) {}
  void all_reduce_sum(float* buf, size_t n) override {
    ++all_reduces;
    inner_->all_reduce_sum(buf, n);
  }
  void broadcast(float* buf, size_t n, int root) override { inner_->broadcast(buf, n, root); }
  void reduce_scatter_sum(float* buf, std::span<const size_t> bounds) override {
    if (reduce_scatters++ == fail_at_) throw std::runtime_error("the test's collective failed here");
    inner_->reduce_scatter_sum(buf, bounds);
  }
  void all_gather(float* buf, std::span<const size_t> bounds) override {
    ++all_gathers;
    inner_->all_gather(buf, bounds);
  }
  int all_reduces = 0, reduce_scatters = 0, all_gathers = 0;

 private:
  std::unique_ptr<kernels::DeviceCollective> inner_;
  int fail_at_;
};

// Records the weights the step observer is shown (learner 0's weight sync reads them so).
class Seen final : public StepObserver {
 public:
  std::span<const std::pair<size_t, size_t>> begin_step(size_t n) override {
    ranges_ = {{0, n}};
    weights.assign(n, 0.0f);
    return ranges_;
  }
  void updated(size_t, size_t begin, size_t end, const float* params) override {
    std::memcpy(weights.data() + begin, params + begin, (end - begin) * sizeof(float));
  }
  void end_step() override { ++steps; }
  std::vector<float> weights;
  int steps = 0;

 private:
  std::vector<std::pair<size_t, size_t>> ranges_;
};

struct Trace {
  std::vector<float> params, seen;
  std::vector<double> losses, norms;
  int optimizer_steps = 0;
  int all_reduces = 0, reduce_scatters = 0, all_gathers = 0;  // a Counted collective's calls
};

struct Variant {
  DeviceKind device;
  ShardStage stage;
  std::optional<ShardStage> resume;  // after the first step: a fresh model and Trainer of that stage
  bool counted = false;              // the learners' device collective is a Counted
  bool offload = false;              // learner.optimizer_offload: the host step over comm instead
};

LearnerConfig config(const Case& c, const Variant& v, ShardStage stage) {
  LearnerConfig l = config(c, stage);
  l.optimizer_offload = v.offload;
  return l;
}

// Two train steps; with v.resume, the second on a fresh model and Trainer loaded with the gathered
// weights, moments and trainer state (as a checkpoint and --resume would).
Result<Trace> run(const Case& c, const Variant& v, Communicator& comm) {
  TROUPE_ASSIGN_OR_RETURN(auto model, make_model(c, v.device));
  auto m = std::make_unique<policy::Model>(std::move(model));
  auto adapter = std::make_unique<ModelAdapter>(*m);
  std::unique_ptr<Counted> counted;
  if (v.counted) counted = std::make_unique<Counted>(m->backend(), comm);
  auto tr = std::make_unique<Trainer>(*adapter, config(c, v, v.stage), comm, counted.get());
  Seen seen;
  Trace t;
  for (int s = 0; s < 2; ++s) {
    if (s == 1 && v.resume) {
      TROUPE_ASSIGN_OR_RETURN(AdamW whole, tr->gathered_optimizer());
      const auto state = tr->state_json();
      const std::vector<float> p(m->params().begin(), m->params().end());
      tr.reset();
      TROUPE_ASSIGN_OR_RETURN(auto fresh, make_model(c, v.device));
      m = std::make_unique<policy::Model>(std::move(fresh));
      std::copy(p.begin(), p.end(), m->params().begin());
      adapter = std::make_unique<ModelAdapter>(*m);
      tr = std::make_unique<Trainer>(*adapter, config(c, v, *v.resume), comm, counted.get());
      TROUPE_TRY(tr->load_optimizer(std::move(whole)));
      TROUPE_TRY(tr->load_state_json(state));
    }
    if (comm.rank() == 0) tr->set_step_observer(&seen);
    TROUPE_ASSIGN_OR_RETURN(auto r, one_step(c, *tr, test::make_batch(40 + static_cast<uint64_t>(s), 16, 32)));
    t.losses.push_back(r.loss.loss);
    t.norms.push_back(r.grad_norm);
    t.optimizer_steps += r.optimizer_steps;
  }
  t.params.assign(m->params().begin(), m->params().end());
  t.seen = seen.weights;
  if (counted) t.all_reduces = counted->all_reduces, t.reduce_scatters = counted->reduce_scatters,
               t.all_gathers = counted->all_gathers;
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int all_ranks(int ok) {
  int all = ok;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

int compare(const Case& c, Communicator& world) {
  auto base = run(c, {DeviceKind::cpu, ShardStage::none, {}}, world);
  if (!base.ok()) {
    std::fprintf(stderr, "rank %d %s, cpu none: %s\n", world.rank(), c.name, base.error().message.c_str());
    return 1;
  }
  const auto O = ShardStage::optimizer, G = ShardStage::gradients, P = ShardStage::parameters;
  const auto F = DeviceKind::cpu_fenced;
  int bad = 0;
  for (const Variant& v : {Variant{F, O, {}}, Variant{F, G, {}}, Variant{F, P, {}}, Variant{F, O, {}, true},
                           Variant{F, G, {}, true}, Variant{F, P, {}, true}, Variant{F, G, O},
                           Variant{F, O, ShardStage::none}, Variant{F, ShardStage::none, G}, Variant{F, P, G},
                           Variant{F, P, {}, false, true}}) {
    auto got = run(c, v, world);
    if (!got.ok()) std::fprintf(stderr, "rank %d: %s\n", world.rank(), got.error().message.c_str());
    bool ok = got.ok() && same_bits(got->params, base->params) && got->losses == base->losses &&
              got->norms == base->norms;
    // Rank 0's observer saw the weights of the last step (the gathered shards).
    if (ok && world.rank() == 0 && !same_bits(got->seen, got->params)) {
      std::fprintf(stderr, "%s: the step observer saw other weights than the step wrote\n", c.name);
      ok = false;
    }
    // Per optimizer step one reduce-scatter of the gradients, the weights' all-gather, and ZeRO-1's
    // gradient all-gather; never an all-reduce. ZeRO-3's sparse arena (no LoRA): a reduce-scatter
    // per range of each layer, the embedding and the head (at least 4 ranges), and the gathers.
    const bool per_layer = v.stage == P && c.lora == 0 && !v.offload;
    if (ok && v.counted && per_layer) {
      const int steps = got->optimizer_steps;
      if (got->reduce_scatters < 4 * steps || got->all_gathers < steps || got->all_reduces != 0) {
        std::fprintf(stderr, "rank %d %s: ZeRO-3 per layer: %d optimizer steps ran %d reduce-scatters, %d all-gathers, %d all-reduces\n",
                     world.rank(), c.name, steps, got->reduce_scatters, got->all_gathers, got->all_reduces);
        ok = false;
      }
    } else if (ok && v.counted) {
      const int steps = got->optimizer_steps, gathers = steps * (v.stage == O ? 2 : 1);
      if (got->reduce_scatters != steps || got->all_gathers != gathers || got->all_reduces != 0) {
        std::fprintf(stderr, "rank %d %s: %d optimizer steps ran %d reduce-scatters, %d all-gathers, %d all-reduces\n",
                     world.rank(), c.name, steps, got->reduce_scatters, got->all_gathers, got->all_reduces);
        ok = false;
      }
    }
    const int all = all_ranks(ok);
    if (world.rank() == 0)
      std::printf("%s, %d ranks: cpu_fenced shard %s%s%s%s%s == cpu none bit for bit: %s (grad_norm %.9g)\n", c.name,
                  world.size(), enum_string(v.stage).c_str(), v.counted ? " (counted device collective)" : "",
                  v.offload ? " (optimizer_offload: the host step)" : "",
                  v.resume ? ", resumed as " : "", v.resume ? enum_string(*v.resume).c_str() : "", all ? "ok" : "MISMATCH",
                  base->norms.back());
    bad |= !all;
  }
  return bad;
}

// A device collective that throws fails the step with an error naming it, on every rank: the
// whole gradient's reduce-scatter (gradients) and a layer's (parameters, the sparse arena).
int check_failure(Communicator& world) {
  const Case c{"failing collective", Phase::grpo, 1.0f};
  int bad = 0;
  for (const auto& [stage, says] : {std::pair{ShardStage::gradients, "reduce-scatter on the device"},
                                    std::pair{ShardStage::parameters, "on the device: the reduce-scatter of a layer's gradient"}}) {
    auto model = make_model(c, DeviceKind::cpu_fenced);
    if (!model.ok()) return 1;
    ModelAdapter adapter(*model);
    Counted failing(model->backend(), world, 0);
    Trainer tr(adapter, config(c, stage), world, &failing);
    auto r = tr.train_step(test::make_batch(40, 16, 32));
    const bool ok = !r.ok() && r.error().message.find(says) != std::string::npos &&
                    r.error().message.find("the test's collective failed here") != std::string::npos;
    if (!ok) std::fprintf(stderr, "rank %d: %s\n", world.rank(), r.ok() ? "the step succeeded" : r.error().message.c_str());
    const int all = all_ranks(ok);
    if (world.rank() == 0)
      std::printf("a failing device collective is named (shard %s): %s\n", enum_string(stage).c_str(), all ? "ok" : "MISSING");
    bad |= !all;
  }
  return bad;
}

// ZeRO-3 on the wide model keeping its shard between steps (as when each learner syncs its own
// shard): during a step at most the shard, the edges, one layer's weights and gradient and the
// embedding's and head's gradients are mapped; between steps the shard and the edges. Rank 0 prints the fractions of the whole (weights + gradients).
// GRPO with two mini-batches runs forwards before its update too (the old log-probs recomputed, the
// mismatch scored), gathered layer by layer as well.
int check_mapped(const Case& c, Communicator& world) {
  auto model = make_model(c, DeviceKind::cpu_fenced);
  if (!model.ok()) return 1;
  const kernels::Backend& be = model->backend();
  const double whole = 2.0 * sizeof(float) * static_cast<double>(model->params().size());
  ModelAdapter adapter(*model);
  // One micro-batch per mini-batch (several accumulate every layer's gradient whole until the last)
  LearnerConfig lc = config(c, ShardStage::parameters);
  lc.batch.micro_batch_size = 8;
  Trainer tr(adapter, lc, world);
  tr.set_params_between_steps(ParamsAtRest::shard);
  const size_t before = be.sparse_mapped_bytes();
  be.reset_sparse_peak();
  double peak = 0, rest = 0;
  bool ok = true;
  for (int s = 0; s < 2 && ok; ++s) {
    auto batch = test::make_batch(40 + static_cast<uint64_t>(s), 16, 32);
    for (size_t i = 0; i < batch.size(); ++i) {  // (GRPO: old log-probs recomputed; the first quarter scored)
      batch[i].behavior_logprobs = std::move(batch[i].old_logprobs);
      batch[i].old_logprobs.clear();
      batch[i].score_mismatch = i < batch.size() / 4;
    }
    auto r = tr.train_step(batch);
    if (!r.ok()) std::fprintf(stderr, "rank %d: %s\n", world.rank(), r.error().message.c_str());
    ok = r.ok();
    if (s == 0) be.reset_sparse_peak();  // (the first step starts from the whole arena)
    peak = static_cast<double>(be.sparse_mapped_peak()) / whole;
    rest = static_cast<double>(be.sparse_mapped_bytes()) / whole;
  }
  // 1/W of the whole is the shard; a layer is about 1/6 of the weights (1/12 of weights + gradients).
  const double shard = 1.0 / world.size();
  ok = ok && before > 0 && rest < shard + 0.05 && peak < shard + 0.2;
  const int all = all_ranks(ok);
  if (world.rank() == 0)
    std::printf("%s, %d ranks: ZeRO-3 on the device maps at most %.3f of the whole arena in a step and keeps %.3f "
                "between steps (shard %.3f): %s\n",
                c.name, world.size(), peak, rest, shard, all ? "ok" : "TOO MUCH");
  return !all;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    auto world = test::mpi_world_or_abort();
    for (const Case& c : {Case{"grpo, clipped", Phase::grpo, 0.05f}, Case{"sft", Phase::sft, 1.0f},
                          Case{"grpo, lora", Phase::grpo, 0.05f, 4},
                          Case{"grpo, streamed parts", Phase::grpo, 0.05f, 0, true},
                          Case{"grpo, wide", Phase::grpo, 0.05f, 0, false, true}})
      bad |= compare(c, *world);
    bad |= check_failure(*world);
    bad |= check_mapped(Case{"sft, wide", Phase::sft, 0.05f, 0, false, true}, *world);
    bad |= check_mapped(Case{"grpo, wide (old log-probs recomputed, mismatch scored)", Phase::grpo, 0.05f, 0, false, true}, *world);
  }
  MPI_Finalize();
  return bad;
}
