// learner.shard parameters (ZeRO-3) on 2 ranks with each fallback of its page pools forced
// (PagePoolFaults, page_pool.h): no memfd (no pools), pools too small (spans that do not fit fault
// ordinary pages in), mappings that fail, unmaps that fail (spans left holding pool pages). Each run's
// parameters, losses and grad_norms must equal the pooled run's bit for bit, and the pooled run
// shard none's; each fallback must have been taken. Exits non-zero on any rank's mismatch.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "troupe/learner/page_pool.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/model.h"
#include "test_support.h"

using namespace troupe;
using namespace troupe::learner;

namespace {

constexpr int kVocab = 64;

// Wide enough that each layer spans many whole pages on each side of the ranks' shard bound.
policy::ModelConfig model_config() {
  policy::ModelConfig mc = test::tiny_model(3, 4);
  mc.vocab_size = kVocab;
  mc.hidden_size = 64;
  mc.num_attention_heads = 4;
  mc.num_key_value_heads = 2;
  mc.head_dim = 16;
  mc.intermediate_size = 128;
  mc.moe_intermediate_size = 64;
  mc.mlp_only_layers = {0};
  return mc;
}

std::vector<Sample> make_batch(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, kVocab - 1), len(1, 7);
  std::normal_distribution<float> nd(0, 1);
  std::vector<Sample> out(static_cast<size_t>(n));
  for (auto& s : out) {
    for (int i = len(rng); i > 0; --i) s.prompt.push_back(tok(rng));
    for (int i = len(rng); i > 0; --i) s.completion.push_back(tok(rng));
    s.advantage = nd(rng);
  }
  return out;
}

LearnerConfig learner_config(ShardStage stage, int micro_batch_tokens) {
  LearnerConfig l;
  l.max_completion_length = 7;
  l.optimizer.lr = 1e-2f;
  l.optimizer.max_grad_norm = 1.0f;
  l.batch.micro_batch_size = 2;
  l.batch.micro_batch_tokens = micro_batch_tokens;  // > 0: the ranks' micro-batch counts differ (idle passes)
  l.seed = 5;
  l.shard = stage;
  return l;
}

struct Trace {
  std::vector<float> params;
  std::vector<double> losses, norms;
};

// Three steps, the weights kept as shards between them, gathered at the end to compare.
Result<Trace> run(ShardStage stage, int micro_batch_tokens, Communicator& comm) {
  auto model = policy::Model::create(model_config(), 11);
  if (!model.ok()) return model.error();
  ModelAdapter m(*model);
  Trainer tr(m, learner_config(stage, micro_batch_tokens), comm);
  if (stage == ShardStage::parameters) tr.set_params_between_steps(ParamsAtRest::shard);
  Trace t;
  for (int s = 0; s < 3; ++s) {
    TROUPE_ASSIGN_OR_RETURN(auto r, tr.train_step(make_batch(40 + static_cast<uint64_t>(s), 16)));
    t.losses.push_back(r.loss.loss);
    t.norms.push_back(r.grad_norm);
  }
  TROUPE_TRY(tr.gather_params());
  t.params.assign(m.params().begin(), m.params().end());
  // The pools' last unmaps (as the Trainer goes) succeed: a span still mapped when its buffer is freed
  // would stay a shared mapping in memory that the next model may get, whose dropped pages then do
  // not read zero (with real models' buffers, mapped and unmapped by malloc whole, it goes with them).
  page_pool_faults().fail_unmap = false;
  return t;
}

// Bit for bit; otherwise says (on stderr) where they first differ.
bool same(const Trace& a, const Trace& b, int rank) {
  for (size_t s = 0; s < a.losses.size() && s < b.losses.size(); ++s)
    if (a.losses[s] != b.losses[s] || a.norms[s] != b.norms[s]) {
      std::fprintf(stderr, "rank %d: step %zu: loss %.9g vs %.9g, grad_norm %.9g vs %.9g\n", rank, s + 1, a.losses[s],
                   b.losses[s], a.norms[s], b.norms[s]);
      return false;
    }
  if (a.params.size() != b.params.size() || a.losses.size() != b.losses.size()) return false;
  for (size_t i = 0; i < a.params.size(); ++i)
    if (std::memcmp(&a.params[i], &b.params[i], sizeof(float)) != 0) {
      std::fprintf(stderr, "rank %d: parameter %zu: %.9g vs %.9g\n", rank, i, a.params[i], b.params[i]);
      return false;
    }
  return true;
}

struct Variant {
  const char* name;
  PagePoolFaults faults;
  // which counter shows the fallback was taken
  size_t PagePoolFaults::*taken;
};

// 1 when every rank got `ok`.
int on_all_ranks(int ok) {
  int all = ok;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

int compare(int micro_batch_tokens, Communicator& world) {
  const std::string what = micro_batch_tokens > 0 ? "a token budget (idle passes)" : "one micro-batch size";
  auto none = run(ShardStage::none, micro_batch_tokens, world);
  page_pool_faults() = {};
  auto pooled = run(ShardStage::parameters, micro_batch_tokens, world);
  const size_t pooled_maps = page_pool_faults().mapped;
  int ok = none.ok() && pooled.ok() && same(*pooled, *none, world.rank()) && pooled_maps > 0;
  if (!pooled.ok()) std::fprintf(stderr, "rank %d: %s\n", world.rank(), pooled.error().message.c_str());
  int bad = !on_all_ranks(ok);
  if (world.rank() == 0)
    std::printf("%s: ZeRO-3 with its page pools (%zu spans mapped on rank 0) == shard none bit for bit: %s\n",
                what.c_str(), pooled_maps, bad ? "MISMATCH" : "ok");
  if (bad) return 1;
  PagePoolFaults small;
  small.max_bytes = 16 * 4096;  // some layers' spans fit, the rest fault ordinary pages in
  PagePoolFaults no_memfd, fail_map, fail_unmap, small_stuck = small;
  no_memfd.no_memfd = true;
  fail_map.fail_map = true;
  fail_unmap.fail_unmap = true;
  small_stuck.fail_unmap = true;
  const Variant variants[] = {{"no memfd (no pool)", no_memfd, nullptr},
                              {"a pool too small (exhausted)", small, &PagePoolFaults::refused},
                              {"every mapping fails", fail_map, &PagePoolFaults::refused},
                              {"every unmap fails (spans stay mapped)", fail_unmap, &PagePoolFaults::stuck},
                              {"a pool too small whose unmaps fail", small_stuck, &PagePoolFaults::stuck}};
  for (const auto& v : variants) {
    page_pool_faults() = v.faults;
    auto got = run(ShardStage::parameters, micro_batch_tokens, world);
    const PagePoolFaults seen = page_pool_faults();
    page_pool_faults() = {};
    const bool taken = v.taken ? seen.*v.taken > 0 : seen.mapped == 0;
    ok = got.ok() && same(*got, *pooled, world.rank()) && taken;
    if (!got.ok()) std::fprintf(stderr, "rank %d: %s\n", world.rank(), got.error().message.c_str());
    const int all = on_all_ranks(ok);
    if (world.rank() == 0)
      std::printf("%s, %s: == the pooled run bit for bit: %s (rank 0: %zu mapped, %zu refused, %zu left mapped)\n",
                  what.c_str(), v.name, all ? "ok" : taken ? "MISMATCH" : "MISMATCH (fallback not taken)", seen.mapped,
                  seen.refused, seen.stuck);
    bad |= !all;
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    auto world = test::mpi_world_or_abort();
    bad |= compare(0, *world);
    bad |= compare(9, *world);
  }
  MPI_Finalize();
  return bad;
}
