// Step 2 of `troupe run`: the job the launcher made can run the cluster section: one rank per role
// under MPI, one learner at most in one process, and no multi-task srun without an MPI plugin (its
// tasks could not form one world). Errors point at cluster.learners in the YAML (exit 2).
#include <cstdio>

#include "run/steps.h"

namespace troupe::launch::run {

int check_world(const LoadedConfig& loaded, const Launcher& launcher, size_t roles) {
  const auto& cluster = loaded.config.cluster;
  if (!launcher.mpi && launcher.srun && env_int("SLURM_STEP_NUM_TASKS", 1) > 1) {
    if (env_int("SLURM_PROCID", 0) == 0)
      std::fprintf(stderr,
                   "troupe: error: srun started %d tasks without an MPI plugin (no PMIx/PMI rank in the environment), "
                   "so they cannot form one job: run srun --mpi=pmix -n %zu (srun --mpi=list shows the plugins; "
                   "MpiDefault in slurm.conf sets the default)\n",
                   env_int("SLURM_STEP_NUM_TASKS", 1), roles);
    return 2;
  }
  if (launcher.mpi) {
    const int n = world_size();
    if (n != static_cast<int>(roles)) {
      auto m = loaded.mark_of("cluster.learners");
      std::fprintf(stderr,
                   "%s:%d:%d: error: cluster: the job has %d ranks but the cluster section places %zu roles "
                   "(learners %d + generators %d + env_workers %d + scorers %d); run %s %zu or change cluster\n",
                   loaded.file.c_str(), m.first, m.second, n, roles, cluster.learners, cluster.generators,
                   cluster.env_workers, cluster.scorers, launcher.srun ? "srun --mpi=pmix -n" : "mpirun -np", roles);
      return 2;
    }
  } else if (cluster.learners > 1) {
    auto m = loaded.mark_of("cluster.learners");
    std::fprintf(stderr,
                 "%s:%d:%d: error: cluster.learners: %d data-parallel learners need one rank each: run under "
                 "mpirun -np %zu or srun --mpi=pmix -n %zu (one process runs a single learner)\n",
                 loaded.file.c_str(), m.first, m.second, cluster.learners, roles, roles);
    return 2;
  }
  return 0;
}

}  // namespace troupe::launch::run
