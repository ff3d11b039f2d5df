// troupe_learner_ep_bench: the helper `troupe bench learner` starts under `mpirun -np 2` for
// ep_moe_layer_2ranks. One MoE layer (forward + backward) on each rank's own tokens, two ways,
// interleaved, each timing between barriers (the slowest rank's): ours = the experts split over the
// 2 ranks (kernels::moe_ep_forward/backward, all-to-all over the learners' MPI communicator), the
// baseline = the unsplit layer on every rank (each rank runs every expert for its own tokens: the
// same expert work in all, no exchange). Rank 0 prints one JSON line with the medians and the bytes
// both ranks sent each other per forward + backward.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "troupe/bench/bench.h"
#include "troupe/kernels/moe.h"
#include "troupe/kernels/moe_expert_parallel.h"
#include "troupe/learner/expert_parallel.h"

namespace k = troupe::kernels;
namespace tb = troupe::bench;

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "learner_ep_bench: %s\n", what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int reps = 7, N = 512;
  k::MoeConfig c;
  c.C = 256, c.H = 256, c.E = 8, c.K = 2;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(3, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--tokens")) N = std::max(1, std::atoi(argv[i + 1]));
  }
  auto comm = troupe::learner::make_mpi_communicator();
  if (!comm.ok()) die(comm.error().message);
  const int rank = (*comm)->rank();
  auto ep = troupe::learner::ExpertParallel::join(**comm, (*comm)->size(), k::cpu_backend());
  if (!ep.ok()) die(ep.error().message);
  const size_t E = c.E, HC = static_cast<size_t>(c.H) * c.C, NC = static_cast<size_t>(N) * c.C;
  const auto router = randn(E * c.C, 1, 0.1f), gate = randn(E * HC, 2, 0.05f), up = randn(E * HC, 3, 0.05f),
             down = randn(E * HC, 4, 0.05f);
  std::vector<float> groute(router.size()), ggate(gate.size()), gup(up.size()), gdown(down.size());
  const auto x = randn(NC, 10 + rank, 1.0f), dout = randn(NC, 20 + rank, 1.0f);
  std::vector<float> y(NC), dx(NC), saved(k::moe_saved_floats(c, N)), scratch(k::moe_scratch_floats(c, N));
  k::MoeWeights w;
  w.w_router = router.data(), w.w_gate = gate.data(), w.w_up = up.data(), w.w_down = down.data();
  k::MoeGrads g;
  g.w_router = groute.data(), g.w_gate = ggate.data(), g.w_up = gup.data(), g.w_down = gdown.data();
  k::MoeEpState state;
  const k::MoeExpertGroup grp{&(*ep)->exchange(), &state};
  auto ours = [&] {
    auto st = k::moe_ep_forward(y.data(), saved.data(), nullptr, x.data(), w, c, N, scratch.data(), nullptr, grp);
    if (st.ok()) st = k::moe_ep_backward(dx.data(), g, dout.data(), 0.0f, x.data(), saved.data(), w, c, N, scratch.data(), grp);
    if (!st.ok()) die(st.error().message);
  };
  auto unsplit = [&] {
    k::moe_forward(y.data(), saved.data(), nullptr, x.data(), w, c, N, scratch.data());
    k::moe_backward(dx.data(), g, dout.data(), 0.0f, x.data(), saved.data(), w, c, N, scratch.data());
  };
  auto timed = [&](auto&& fn) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = tb::now_ms();
    fn();
    double dt = tb::now_ms() - t0, slowest = 0;
    MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
  };
  ours();  // warm-up (connections, page faults, the state's buffers)
  unsplit();
  // The rows this rank sends its peer: its routed rows for the other rank's experts (forward C floats
  // out and C back, backward C + 1 out and C + 1 back).
  const auto routing = k::moe_saved_routing(saved.data(), c, N);
  const int per = c.E / (*ep)->size(), mine = (*ep)->rank();
  double rows = 0;
  for (int e = 0; e < c.E; ++e)
    if (e / per != mine) rows += routing.offsets[e + 1] - routing.offsets[e];
  double bytes = rows * 4.0 * (2.0 * c.C + 2.0 * (c.C + 1)), all_bytes = 0;
  MPI_Allreduce(&bytes, &all_bytes, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  std::vector<double> a, b;
  for (int r = 0; r < reps; ++r) {
    if (r % 2 == 0) {
      a.push_back(timed(ours));
      b.push_back(timed(unsplit));
    } else {
      b.push_back(timed(unsplit));
      a.push_back(timed(ours));
    }
    std::fill(ggate.begin(), ggate.end(), 0.0f);  // keep the accumulated gradients small
  }
  if (rank == 0) {
    std::printf("{\"tokens_per_rank\": %d, \"reps\": %d, \"ours_ms\": %.6f, \"unsplit_ms\": %.6f, \"alltoall_bytes\": %.0f, "
                "\"C\": %d, \"H\": %d, \"E\": %d, \"K\": %d}\n", N, reps, tb::median(a), tb::median(b), all_bytes, c.C, c.H,
                c.E, c.K);
    std::fflush(stdout);
  }
  ep.value().reset();
  comm.value().reset();
  MPI_Finalize();
  return 0;
}
