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

// `troupe run --restarts N` (N > 0): the job as the supervisor starts it, again after
// each failure from the latest checkpoint (run_supervisor.cpp).
struct SupervisorOptions {
  std::string config;              // the experiment YAML
  std::vector<std::string> sets;   // its --set overrides
  std::string run_dir;             // run.dir (or the --resume directory)
  bool resume = false;             // the first start resumes run_dir
  int restarts = 0;
  std::string launcher;            // e.g. "mpirun -np 4" or "mpirun -np {np}"; empty = one process
  bool remaining_ranks = false;    // run.restart_remaining_ranks: restart without the ranks the launcher reported lost
  actors::ClusterSection cluster;  // the config's cluster section ({np}, and what the lost ranks played)
};
int supervise_run(const SupervisorOptions& o);

// Runs the experiment on every rank (under mpirun/srun each rank runs the same command).
int run_experiment(const LoadedConfig& loaded, const RunOptions& opt);
// Prints one JSON object: eval_accuracy, eval_reward_mean (and per env), checkpoint. An adapter
// checkpoint (adapter_config.json: a LoRA run's checkpoint or a PEFT adapter) is evaluated on `base`,
// else policy.path, else its base.json's path; its base.json fingerprint must match that base.
int eval_checkpoint(const LoadedConfig& loaded, const std::string& checkpoint, const std::string& base = "");
// `troupe validate`: makes every built-in env as a run would (the dataset env reads and checks
// every row of its files); the first error, naming the env and the file and line (env_data_check.cpp).
Status check_env_data(const LoadedConfig& loaded);

}  // namespace troupe::launch
