// troupe_learner_ep_state_bench: the helper `troupe bench learner` starts under `mpirun -np 2` for
// ep_state_bytes_2ranks. A small Qwen3-MoE-shaped model (2 MoE layers of 16 experts, hidden 512,
// expert width 256, a 8192 vocabulary), two learners two ways: plain data parallelism (every rank
// holds every expert) and policy.moe.expert_parallel = 2 with the experts divided (each rank's
// model from policy::Model::slice_experts). Their GRPO steps are timed alternately between barriers
// (the slowest rank's); each trainer's state_bytes is the largest rank's. Learner 0 in `troupe run`
// terms: its state plus what its weight sync keeps (fp32, the generators' copy of what it sends: with
// the experts divided its actors::ExpertRunsEncoder after one full encoding, its experts and half of
// the rest; under data parallelism the whole WeightEncoder's copy, 4 bytes per parameter). Rank 0
// prints one JSON line {"ranks","params","routed_params","tokens_per_rank","dp_ms","ours_ms",
// "dp_state_bytes","ours_state_bytes","learner0_sync_bytes","learner0_dp_sync_bytes",
// "learner0_bytes","learner0_dp_bytes"}.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/expert_sync.h"
#include "rank_step_timing.h"
#include "troupe/bench/bench.h"
#include "troupe/learner/expert_parallel.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/model.h"

namespace {

using namespace troupe;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "learner_ep_state_bench: %s\n", what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

policy::ModelConfig moe_shape() {
  policy::ModelConfig mc;
  mc.family = policy::ModelFamily::qwen3_moe;
  mc.vocab_size = 8192;
  mc.hidden_size = 512;
  mc.num_hidden_layers = 2;
  mc.num_attention_heads = 8;
  mc.num_key_value_heads = 4;
  mc.head_dim = 64;
  mc.intermediate_size = 1024;
  mc.num_experts = 16;
  mc.num_experts_per_tok = 4;
  mc.moe_intermediate_size = 256;
  return mc;
}

std::vector<learner::Sample> make_batch(int seqs, int seq_len, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  std::normal_distribution<float> nd(0, 1);
  std::vector<learner::Sample> out(static_cast<size_t>(seqs));
  for (auto& s : out) {
    for (int i = 0; i < seq_len / 4; ++i) s.prompt.push_back(tok(rng));
    for (int i = seq_len / 4; i < seq_len; ++i) s.completion.push_back(tok(rng));
    s.advantage = nd(rng);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    int reps = 5, seqs = 4, seq_len = 64;
    for (int i = 1; i + 1 < argc; ++i) {
      if (std::string(argv[i]) == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
      if (std::string(argv[i]) == "--seq-len") seq_len = std::max(8, std::atoi(argv[i + 1]));
    }
    auto comm = learner::make_mpi_communicator();
    if (!comm.ok()) fail(comm.error().message);
    learner::Communicator& world = **comm;
    const int E = world.size();
    if (E < 2) fail("run it on 2 or more ranks (mpirun -np 2)");
    const policy::ModelConfig mc = moe_shape();
    auto whole = policy::Model::create(mc, 0);
    if (!whole.ok()) fail(whole.error().message);
    auto block = whole->slice_experts(world.rank() % E, E);
    if (!block.ok()) fail(block.error().message);
    learner::ModelAdapter dp_model(*whole), ep_model(*block);
    learner::LearnerConfig cfg;
    cfg.optimizer.lr = 1e-5f;
    cfg.max_completion_length = seq_len;
    learner::LearnerConfig divided = cfg;
    divided.expert_parallel = E;
    learner::Trainer dp(dp_model, cfg, world), ours(ep_model, divided, world);
    auto timed = [&](learner::Trainer& t, uint64_t seed) {
      auto r = bench::time_rank_step(t, make_batch(seqs * world.size(), seq_len, mc.vocab_size, seed));
      if (!r.ok()) fail(r.error().message);
      return r->slowest_ms;
    };
    timed(dp, 1);  // warm-up: arenas, connections
    timed(ours, 1);
    std::vector<double> a, b;
    for (int r = 0; r < reps; ++r) {
      const uint64_t seed = 10 + static_cast<uint64_t>(r);
      if (r % 2 == 0) {
        b.push_back(timed(dp, seed));
        a.push_back(timed(ours, seed));
      } else {
        a.push_back(timed(ours, seed));
        b.push_back(timed(dp, seed));
      }
    }
    // What learner 0's weight sync keeps with the experts divided: the runs it sends, held in fp32.
    auto runs = actors::ExpertRunsEncoder::make(actors::WeightDtype::fp32, *block->expert_shards());
    if (!runs.ok()) fail(runs.error().message);
    actors::Weights head;
    std::vector<runtime::Bytes> payloads;
    if (Status st = (*runs)->encode(std::as_const(*block).params(), 1, false, head, payloads); !st.ok())
      fail(st.error().message);
    const size_t sync_bytes = (*runs)->values() * sizeof(float);
    payloads.clear();
    double mine[2] = {static_cast<double>(dp.state_bytes()), static_cast<double>(ours.state_bytes())}, most[2];
    MPI_Allreduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const size_t P = whole->params().size(), routed = P - learner::local_size(*block->expert_shards()) +
                                                         (P - learner::local_size(*block->expert_shards())) / (E - 1);
    if (world.rank() == 0) {
      std::printf("{\"ranks\": %d, \"params\": %zu, \"routed_params\": %zu, \"tokens_per_rank\": %d, \"dp_ms\": %.3f, "
                  "\"ours_ms\": %.3f, \"dp_state_bytes\": %.0f, \"ours_state_bytes\": %.0f, "
                  "\"learner0_sync_bytes\": %zu, \"learner0_dp_sync_bytes\": %zu, \"learner0_bytes\": %.0f, "
                  "\"learner0_dp_bytes\": %.0f}\n",
                  world.size(), P, routed, seqs * seq_len, bench::median(b), bench::median(a), most[0], most[1],
                  sync_bytes, P * sizeof(float), mine[1] + static_cast<double>(sync_bytes),
                  mine[0] + static_cast<double>(P * sizeof(float)));
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
