// run.restart_remaining_ranks: which ranks a failed job lost, read from what its launcher printed
// (Open MPI's mpirun, Slurm's srun), the cluster section without them, and run.launcher's {np}.
#pragma once

#include <string>
#include <vector>

#include "troupe/actors/experiment_config.h"

namespace troupe::launch {

// The ranks the launcher reported dead by a signal in its stderr `text`: Open MPI's "process rank R
// with PID P on node N exited on signal S" and "Process name: [[J,S],R]" followed by "Exit code: C"
// with C > 128 (a rank's wrapper script passing on a signal's code), srun's "task R: Killed".
// Sorted, each once.
std::vector<int> lost_ranks_in(const std::string& text);

struct RemainingRanks {
  actors::ClusterSection cluster;  // the cluster section without the lost roles
  std::vector<std::string> left_out;  // their names (learner1, generator0, ...)
  std::vector<std::string> kept;      // lost roles kept: the last of their kind, or ranks past the world
};
// `cluster` without the roles of `ranks` (the rank layout of run/placement.cpp: learners, generators,
// env workers, scorers); each kind keeps at least one role.
RemainingRanks without_ranks(const actors::ClusterSection& cluster, const std::vector<int>& ranks);

// The world size of `cluster` under a launcher: one rank per role.
int world_size(const actors::ClusterSection& cluster);

// `launcher` with every "{np}" replaced by `np`.
std::string with_np(std::string launcher, int np);

}  // namespace troupe::launch
