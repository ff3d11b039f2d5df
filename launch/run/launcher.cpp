// Step 1 of `troupe run`: who started this process (mpirun, srun with or without an MPI plugin, or
// nobody: one process) and how many cores its compute may use. Read from the environment before
// MPI_Init; the variables are the ones runtime::Cluster checks, so both agree on whether this is MPI.
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "run/steps.h"

namespace troupe::launch::run {

namespace {

// mpirun (Open MPI) and srun with an MPI plugin (--mpi=pmix or pmi2) both give each task a
// PMI/PMIx rank (cluster.cpp launched_by_mpi). SLURM_* alone is no MPI job: an sbatch script
// itself has SLURM_PROCID=0 and SLURM_NTASKS of the allocation, and a bare srun (MpiDefault=none)
// starts tasks that cannot form a world.
bool under_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

// srun started this task (direct launch), as opposed to mpirun, whose ranks may live in a SLURM
// allocation too but always carry OMPI_COMM_WORLD_SIZE.
bool under_srun() { return std::getenv("SLURM_STEP_NUM_TASKS") && !std::getenv("OMPI_COMM_WORLD_SIZE"); }

// The ranks of the job; -1 when the launcher does not say (then MPI_Comm_size does).
int world_size_from_env() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return -1;
}

// Entry `index` of SLURM's compressed per-node list, e.g. "2(x3),1" = 2,2,2,1; -1 if out of range.
int slurm_per_node(const char* list, int index) {
  for (const char* p = list; p && *p;) {
    char* end = nullptr;
    long v = std::strtol(p, &end, 10);
    if (end == p) return -1;
    long reps = 1;
    if (end[0] == '(' && end[1] == 'x') {
      reps = std::strtol(end + 2, &end, 10);
      if (*end == ')') ++end;
    }
    if (index < reps) return static_cast<int>(v);
    index -= static_cast<int>(reps);
    p = *end == ',' ? end + 1 : end;
  }
  return -1;
}

// Ranks of this job on this node (they share its cores).
int local_ranks_from_env() {
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::max(1, std::atoi(s));
  if (under_srun()) {
    int n = slurm_per_node(std::getenv("SLURM_STEP_TASKS_PER_NODE"), env_int("SLURM_NODEID", 0));
    if (n > 0) return n;
  }
  if (const char* s = std::getenv("MPI_LOCALNRANKS")) return std::max(1, std::atoi(s));  // MPICH hydra
  return 1;
}

}  // namespace

Launcher detect_launcher() { return Launcher{under_mpi(), under_srun()}; }

int env_int(const char* name, int dflt) {
  const char* s = std::getenv(name);
  return s && *s ? std::atoi(s) : dflt;
}

void ensure_mpi_initialized() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
}

int world_size() {
  int n = world_size_from_env();
  if (n < 0) {  // a PMIx launcher that exports no size: ask MPI (initialized later anyway)
    ensure_mpi_initialized();
    MPI_Comm_size(MPI_COMM_WORLD, &n);
  }
  return n;
}

int set_compute_threads(int configured, const Launcher& launcher) {
  // compute threads: as configured, else the cores shared by the ranks on this node
  int threads = configured;
  // (srun -c N / --cpus-per-task=N: N each)
  if (threads == 0 && launcher.mpi) {
    if (launcher.srun && env_int("SLURM_CPUS_PER_TASK", 0) > 0)
      threads = env_int("SLURM_CPUS_PER_TASK", 1);
    else
      threads = std::max(1, omp_get_num_procs() / local_ranks_from_env());
  }
  if (threads > 0) omp_set_num_threads(threads);
  return threads > 0 ? threads : omp_get_max_threads();
}

}  // namespace troupe::launch::run
