// troupe_learner_allreduce_bench: the helper `troupe bench learner` starts under `mpirun -np 2`.
// Times the learner's gradient reduction (Communicator::allreduce_sum on the flat buffer) against a
// raw MPI_Allreduce(MPI_IN_PLACE) of the same buffer, interleaved, each timing between barriers;
// rank 0 prints one JSON line {"floats","reps","ours_ms","raw_ms"} (medians of the slowest rank).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "troupe/learner/communicator.h"
#include "troupe/policy/model.h"

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  long floats = 0;
  int reps = 9;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--floats")) floats = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(5, std::atoi(argv[i + 1]));
  }
  if (floats <= 0) {  // model-sized: the default policy config's parameter count
    auto m = troupe::policy::Model::create(troupe::policy::ModelConfig{}, 0);
    if (!m.ok()) {
      std::fprintf(stderr, "allreduce_bench: %s\n", m.error().message.c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    floats = static_cast<long>(m->params().size());
  }
  auto comm = troupe::learner::make_mpi_communicator();
  if (!comm.ok()) {
    std::fprintf(stderr, "allreduce_bench: %s\n", comm.error().message.c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<float> buf(static_cast<size_t>(floats), 1e-3f);
  auto ours = [&] {
    auto st = (*comm)->allreduce_sum(std::span<float>(buf));
    if (!st.ok()) {
      std::fprintf(stderr, "allreduce_bench: %s\n", st.error().message.c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  };
  auto raw = [&] { MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
  auto timed = [&](auto&& fn) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_ms();
    fn();
    double dt = now_ms() - t0, slowest = 0;
    MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
  };
  ours();  // warm-up both paths (connection set-up, page faults)
  raw();
  std::vector<double> a, b;
  for (int r = 0; r < reps; ++r) {
    if (r % 2 == 0) {
      a.push_back(timed(ours));
      b.push_back(timed(raw));
    } else {
      b.push_back(timed(raw));
      a.push_back(timed(ours));
    }
    std::fill(buf.begin(), buf.end(), 1e-3f);  // keep values finite
  }
  if (rank == 0) {
    std::printf("{\"floats\": %ld, \"reps\": %d, \"ours_ms\": %.6f, \"raw_ms\": %.6f}\n", floats, reps, median(a), median(b));
    std::fflush(stdout);
  }
  comm.value().reset();
  MPI_Finalize();
  return 0;
}
