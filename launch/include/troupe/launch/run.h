// The launcher's two run entry points (launch/run.cpp, its steps in launch/run/): a whole experiment
// (threads of one process, or the MPI ranks of `mpirun -np N troupe run`) and the held-out
// evaluation of a checkpoint.
// Both return the process exit code (0, 2 bad config/input, 3 a peer failed, 1 otherwise).
#pragma once

#include <string>
#include <vector>

#include "troupe/launch/config.h"

namespace troupe::launch {

struct RunOptions {
  std::string resume_dir;  // non-empty: continue this run directory from checkpoints/latest
};

// Role of each rank: learner0.., generator0.., env0.. (rank 0 also hosts the coordinator).
Result<std::vector<std::string>> rank_roles(const actors::ExperimentConfig& cfg);
int run_experiment(const LoadedConfig& loaded, const RunOptions& opt);
// Prints one JSON object: eval_accuracy, eval_reward_mean (and per env), checkpoint.
int eval_checkpoint(const LoadedConfig& loaded, const std::string& checkpoint);

}  // namespace troupe::launch
