// One learner step timed across MPI ranks, for the bench helpers that start their own ranks under
// mpirun (troupe_learner_shard_bench, troupe_learner_ep_state_bench).
#pragma once

#include <vector>

#include "troupe/base/result.h"
#include "troupe/learner/trainer.h"

namespace troupe::bench {

struct RankStep {
  double slowest_ms = 0;  // the slowest rank's train_step, from a common barrier
  double loss = 0;        // this rank's step loss (for the caller's checks)
};

// Every rank of MPI_COMM_WORLD calls it with its trainer and its batch (a collective): a barrier,
// this rank's Trainer::train_step, then the largest of the ranks' step times by MPI_Allreduce.
Result<RankStep> time_rank_step(learner::Trainer& trainer, const std::vector<learner::Sample>& batch);

}  // namespace troupe::bench
