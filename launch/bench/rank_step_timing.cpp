// One learner step timed across MPI ranks (rank_step_timing.h).
#include "rank_step_timing.h"

#include <mpi.h>

#include "troupe/bench/bench.h"

namespace troupe::bench {

Result<RankStep> time_rank_step(learner::Trainer& trainer, const std::vector<learner::Sample>& batch) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now_ms();
  auto r = trainer.train_step(batch);
  double dt = now_ms() - t0;
  RankStep out;
  // (the all-reduce runs whatever the step's outcome, so a failing rank does not leave its peers waiting)
  MPI_Allreduce(&dt, &out.slowest_ms, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (!r.ok()) return r.error();
  out.loss = r->loss.loss;
  return out;
}

}  // namespace troupe::bench
