// troupe_learner_shard_bench: the helper `troupe bench learner` starts under mpirun for the sharded
// learner cases. A model of SmolLM2-135M's shape (its layer count cut by --layers) for each of two
// Trainers, the same initial weights: plain data parallel (learner.shard: none) and --stage (with
// parameters, also a third without the prefetch; ZeRO-3 keeps its shard between steps, as troupe
// run's synchronous learners do); their GRPO steps are timed alternately between barriers (the
// slowest rank's time). Rank 0 prints one JSON line {"stage","ranks","params","tokens_per_rank","dp_ms","ours_ms",
// "no_prefetch_ms" (parameters only),"dp_state_bytes","ours_state_bytes"}. With --device cpu_fenced both
// models live in (fenced) device memory and there is no third Trainer; with parameters the line adds what
// ZeRO-3's sparse device arena mapped (the largest rank): "ours_device_peak_bytes" at once during the
// timed steps, "ours_device_rest_bytes" after them, against data parallelism's "dp_device_bytes".
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "smollm2_shape.h"
#include "troupe/base/enum_names.h"
#include "rank_step_timing.h"
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
  bool fenced = false;  // --device cpu_fenced
};

// A model, its adapter and one Trainer over them.
struct Arm {
  Arm(policy::Model m, const learner::LearnerConfig& cfg, learner::Communicator& comm)
      : model(std::move(m)), adapter(model), trainer(adapter, cfg, comm) {}
  policy::Model model;
  learner::ModelAdapter adapter;
  learner::Trainer trainer;
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
    } else if (a == "--device") {
      if (std::string(v) != "cpu_fenced") fail(std::string("--device ") + v + ": only cpu_fenced");
      o.fenced = true;
      ++i;
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
    if (o.fenced) mc.device = kernels::DeviceKind::cpu_fenced;
    learner::LearnerConfig cfg;
    cfg.optimizer.lr = 1e-5f;
    cfg.max_completion_length = o.seq_len;
    learner::LearnerConfig sharded = cfg;
    sharded.shard = o.stage;
    const bool zero3 = o.stage == learner::ShardStage::parameters;
    // A model each: a ZeRO-3 Trainer drops the weights it does not own and puts its ParamHook on its model.
    std::vector<std::unique_ptr<Arm>> arms;
    for (int a = 0; a < (zero3 && !o.state_only && !o.fenced ? 3 : 2); ++a) {
      auto model = policy::Model::create(mc, 0);
      if (!model.ok()) fail(model.error().message);
      arms.push_back(std::make_unique<Arm>(std::move(*model), a == 0 ? cfg : sharded, world));
    }
    learner::Trainer &dp = arms[0]->trainer, &ours = arms[1]->trainer;
    if (zero3) ours.set_params_between_steps(learner::ParamsAtRest::shard);
    if (arms.size() > 2) {
      arms[2]->trainer.set_shard_prefetch(false);
      arms[2]->trainer.set_params_between_steps(learner::ParamsAtRest::shard);
    }
    double dp_ms = 0, ours_ms = 0, blocking_ms = 0;
    if (!o.state_only) {
      // Every trainer steps on the same batches, so each step's loss must be data parallelism's (a
      // check that the sharded step computed what it is timed for).
      std::vector<double> losses[3];
      auto timed = [&](size_t arm, uint64_t seed) {
        auto r = bench::time_rank_step(arms[arm]->trainer, make_batch(o, world.size(), mc.vocab_size, seed));
        if (!r.ok()) fail(r.error().message);
        losses[arm].push_back(r->loss);
        return r->slowest_ms;
      };
      for (size_t arm = 0; arm < arms.size(); ++arm) timed(arm, 1);  // warm-up: arenas, connections
      arms[1]->model.backend().reset_sparse_peak();  // (the first step starts from the whole arena)
      std::vector<double> a, b, c;
      for (int r = 0; r < o.reps; ++r) {
        const uint64_t seed = 10 + static_cast<uint64_t>(r);
        if (r % 2 == 0) {
          b.push_back(timed(0, seed));
          a.push_back(timed(1, seed));
          if (arms.size() > 2) c.push_back(timed(2, seed));
        } else {
          if (arms.size() > 2) c.push_back(timed(2, seed));
          a.push_back(timed(1, seed));
          b.push_back(timed(0, seed));
        }
      }
      for (size_t arm = 1; arm < arms.size(); ++arm)
        for (size_t i = 0; i < losses[0].size(); ++i)
          if (std::abs(losses[arm][i] - losses[0][i]) > 1e-6 * (1 + std::abs(losses[0][i])))
            fail("step " + std::to_string(i) + ": the loss " + std::to_string(losses[arm][i]) + " of the " +
                 enum_string(o.stage) + " trainer is not data parallelism's " + std::to_string(losses[0][i]));
      dp_ms = bench::median(b);
      ours_ms = bench::median(a);
      if (!c.empty()) blocking_ms = bench::median(c);
    }
    // ZeRO-3 on the device: what its sparse arena mapped (the other arms hold no sparse buffer)
    const kernels::Backend& be = arms[1]->model.backend();
    double mapped[2] = {static_cast<double>(be.sparse_mapped_peak()), static_cast<double>(be.sparse_mapped_bytes())},
           mapped_most[2];
    MPI_Allreduce(mapped, mapped_most, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    // the largest rank's state (the shards differ by at most 16 values)
    double mine[2] = {static_cast<double>(dp.state_bytes()), static_cast<double>(ours.state_bytes())}, most[2];
    MPI_Allreduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (world.rank() == 0 && o.fenced && zero3)
      std::printf("{\"ours_device_peak_bytes\": %.0f, \"ours_device_rest_bytes\": %.0f, \"dp_device_bytes\": %zu}\n",
                  mapped_most[0], mapped_most[1], 2 * sizeof(float) * arms[0]->adapter.params().size());
    if (world.rank() == 0) {
      std::printf("{\"stage\": \"%s\", \"ranks\": %d, \"params\": %zu, \"tokens_per_rank\": %d, \"dp_ms\": %.3f, "
                  "\"ours_ms\": %.3f, \"no_prefetch_ms\": %.3f, \"dp_state_bytes\": %.0f, \"ours_state_bytes\": %.0f}\n",
                  enum_string(o.stage).c_str(), world.size(), arms[0]->adapter.params().size(), o.seqs * o.seq_len, dp_ms,
                  ours_ms, blocking_ms, most[0], most[1]);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
