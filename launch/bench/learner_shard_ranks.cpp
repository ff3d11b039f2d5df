// troupe_learner_shard_bench: the helper `troupe bench learner` starts under mpirun for the sharded
// learner cases. One model of SmolLM2-135M's shape (its layer count cut by --layers), two Trainers
// over it: plain data parallel (learner.shard: none) and --stage (with parameters, also without the
// prefetch); their GRPO steps are timed alternately between barriers (the slowest rank's time). Rank
// 0 prints one JSON line {"stage","ranks","params","tokens_per_rank","dp_ms","ours_ms",
// "no_prefetch_ms" (parameters only),"dp_state_bytes","ours_state_bytes"}.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "smollm2_shape.h"
#include "troupe/base/enum_names.h"
#include "troupe/bench/bench.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/model.h"

namespace {

using namespace troupe;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "learner_shard_bench: %s\n", what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

struct Options {
  learner::ShardStage stage = learner::ShardStage::gradients;
  int layers = 30, seqs = 4, seq_len = 256, reps = 5;
  bool state_only = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--stage") {
      auto s = enum_from_name<learner::ShardStage>(v);
      if (!s) fail(std::string("--stage ") + v + ": not none, optimizer, gradients or parameters");
      o.stage = *s;
      ++i;
    } else if (a == "--layers") {
      o.layers = std::max(1, std::atoi(v));
      ++i;
    } else if (a == "--seqs") {
      o.seqs = std::max(1, std::atoi(v));
      ++i;
    } else if (a == "--seq-len") {
      o.seq_len = std::max(8, std::atoi(v));
      ++i;
    } else if (a == "--reps") {
      o.reps = std::max(1, std::atoi(v));
      ++i;
    } else if (a == "--state-only") {
      o.state_only = true;
    }
  }
  return o;
}

// seqs sequences per rank of seq_len tokens (a quarter prompt), every rank's in one global batch.
std::vector<learner::Sample> make_batch(const Options& o, int ranks, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  std::normal_distribution<float> nd(0, 1);
  std::vector<learner::Sample> out(static_cast<size_t>(o.seqs * ranks));
  const int prompt = std::max(1, o.seq_len / 4);
  for (auto& s : out) {
    for (int i = 0; i < prompt; ++i) s.prompt.push_back(tok(rng));
    for (int i = prompt; i < o.seq_len; ++i) s.completion.push_back(tok(rng));
    s.advantage = nd(rng);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    const Options o = parse(argc, argv);
    auto comm = learner::make_mpi_communicator();
    if (!comm.ok()) fail(comm.error().message);
    learner::Communicator& world = **comm;
    policy::ModelConfig mc;
    static_cast<policy::ModelArchitecture&>(mc) = bench::smollm2_135m_architecture();
    mc.num_hidden_layers = o.layers;
    auto model = policy::Model::create(mc, 0);
    if (!model.ok()) fail(model.error().message);
    learner::ModelAdapter adapter(*model);
    learner::LearnerConfig cfg;
    cfg.optimizer.lr = 1e-5f;
    cfg.max_completion_length = o.seq_len;
    learner::LearnerConfig sharded = cfg;
    sharded.shard = o.stage;
    learner::Trainer dp(adapter, cfg, world), ours(adapter, sharded, world), blocking(adapter, sharded, world);
    const bool zero3 = o.stage == learner::ShardStage::parameters;
    blocking.set_shard_prefetch(false);
    // ZeRO-3's state: its shard of the weights between steps (timed steps need them whole: the two
    // trainers take turns on one model)
    if (o.state_only) ours.set_params_between_steps(learner::ParamsAtRest::shard);
    double dp_ms = 0, ours_ms = 0, blocking_ms = 0;
    if (!o.state_only) {
      auto timed = [&](learner::Trainer& t, uint64_t seed) {
        const auto batch = make_batch(o, world.size(), mc.vocab_size, seed);
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = bench::now_ms();
        auto r = t.train_step(batch);
        if (!r.ok()) fail(r.error().message);
        double dt = bench::now_ms() - t0, slowest = 0;
        MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return slowest;
      };
      timed(dp, 1);  // warm-up: arenas, connections
      timed(ours, 2);
      if (zero3) timed(blocking, 3);
      std::vector<double> a, b, c;
      for (int r = 0; r < o.reps; ++r) {
        const uint64_t seed = 10 + static_cast<uint64_t>(r);
        if (r % 2 == 0) {
          b.push_back(timed(dp, seed));
          a.push_back(timed(ours, seed));
          if (zero3) c.push_back(timed(blocking, seed));
        } else {
          if (zero3) c.push_back(timed(blocking, seed));
          a.push_back(timed(ours, seed));
          b.push_back(timed(dp, seed));
        }
      }
      dp_ms = bench::median(b);
      ours_ms = bench::median(a);
      if (zero3) blocking_ms = bench::median(c);
    }
    // the largest rank's state (the shards differ by at most 16 values)
    double mine[2] = {static_cast<double>(dp.state_bytes()), static_cast<double>(ours.state_bytes())}, most[2];
    MPI_Allreduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (world.rank() == 0) {
      std::printf("{\"stage\": \"%s\", \"ranks\": %d, \"params\": %zu, \"tokens_per_rank\": %d, \"dp_ms\": %.3f, "
                  "\"ours_ms\": %.3f, \"no_prefetch_ms\": %.3f, \"dp_state_bytes\": %.0f, \"ours_state_bytes\": %.0f}\n",
                  enum_string(o.stage).c_str(), world.size(), adapter.params().size(), o.seqs * o.seq_len, dp_ms,
                  ours_ms, blocking_ms, most[0], most[1]);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
