// The steps of `troupe run` (run.cpp's run_experiment calls them in this order), one file each
// under launch/run/: detect the launcher, check the world, plan placement, check the run
// directory, start the cluster, spawn the roles, run the coordinator and stop. Steps that can end
// the command return its exit code (0: go on) and have printed why; the others return errors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/actors/coordinator.h"
#include "troupe/actors/roles.h"
#include "troupe/actors/scorer.h"
#include "troupe/launch/config.h"
#include "troupe/launch/run.h"
#include "troupe/learner/communicator.h"
#include "troupe/runtime/cluster.h"

namespace troupe::launch::run {

// ---- launcher.cpp: who started this process --------------------------------------------------

struct Launcher {
  bool mpi = false;   // mpirun, or srun with an MPI plugin: a PMI/PMIx rank in the environment
  bool srun = false;  // srun started this task (direct launch), not mpirun inside an allocation
};
Launcher detect_launcher();
// An integer from the environment, `dflt` when unset or empty.
int env_int(const char* name, int dflt);
// The ranks of the job as the launcher says, else MPI_Comm_size (MPI is initialized then).
int world_size();
// MPI_Init_thread(MPI_THREAD_MULTIPLE) unless MPI is up already.
void ensure_mpi_initialized();
// Sets OpenMP's threads for the compute of this rank (cluster.threads, else under MPI the cores
// its node's ranks share, srun -c N: N) and returns the threads a role may use.
int set_compute_threads(int configured, const Launcher& launcher);

// ---- placement.cpp: which rank hosts which role ----------------------------------------------

enum class RoleKind { learner, generator, env, scorer };

// One role of the run: rank r hosts the r-th (learners first, rank 0 also hosts the coordinator,
// then generators, then env workers, then scorers). `name` is what users and logs see: "learner0", "env2".
struct PlacedRole {
  RoleKind kind;
  int index;  // among the roles of its kind
  std::string name;
};
using Placement = std::vector<PlacedRole>;

Placement plan_placement(const actors::ClusterSection& cluster);
// "learner", "generator", "env", "scorer": the role names' stems (and actors::role_threads' role).
const char* role_kind_name(RoleKind kind);

// ---- world_check.cpp ---------------------------------------------------------------------------

// The job's ranks fit the cluster section: under MPI one rank per role, without MPI one learner
// at most, and no multi-task srun without an MPI plugin. 0, or 2 with a FILE:LINE:COL error.
int check_world(const LoadedConfig& loaded, const Launcher& launcher, size_t roles);

// ---- run_dir_checks.cpp --------------------------------------------------------------------------

// A new run's run.dir holds no run; a resumed one has a whole checkpoint and its own config up to
// the keys a resume may change. 0 with *resume_after set (the checkpoint's step, -1 for a new
// run), or 2 with the reason on stderr. Nothing is written. shared_reads (a job of several ranks):
// the checkpoint's listing and sizes only; verify_resume_shared reads the bytes once the ranks are up.
int check_run_dir(const LoadedConfig& loaded, const RunOptions& opt, const std::string& run_dir,
                  bool shared_reads, int64_t* resume_after);
// The rest of a --resume's check in a job of several ranks (every rank calls it after start_cluster,
// before anything is written): the checkpoint's checksum reads split among the ranks
// (learner::verify_checkpoint_part), so each file is read once in the job; a rank that finds a bad
// file names it, and every rank returns 2 (rank 0 naming the earlier checkpoints that are whole).
int verify_resume_shared(runtime::Cluster& cluster, const std::string& run_dir);

// ---- cluster_start.cpp ---------------------------------------------------------------------------

// Bootstraps this process's cluster (one node without MPI) and, under MPI, prints on rank 0
// where every rank listens. On failure prints the error, ends an MPI job (MPI_Abort) and returns
// the exit code with *out unset.
int start_cluster(const LoadedConfig& loaded, const actors::ExperimentConfig& cfg, const Launcher& launcher,
                  const Placement& placement, std::unique_ptr<runtime::Cluster>* out);
// The learners' own communicator (a split of the world; only learner ranks get one); null in
// one process.
Result<std::unique_ptr<learner::Communicator>> learners_communicator(runtime::Cluster& cluster, int learners);

// ---- spawn_roles.cpp -----------------------------------------------------------------------------

struct HostedRoles {
  std::vector<std::shared_ptr<actors::EnvWorker>> envs;
  std::vector<std::shared_ptr<actors::Generator>> gens;
  std::vector<int> gen_indices;  // gens[i] is generator gen_indices[i]
  std::vector<std::shared_ptr<actors::LearnerRole>> learners;
  std::vector<std::shared_ptr<actors::Scorer>> scorers;
  actors::RolePeers peers;  // every role's address, hosted here or not
};

// Spawns the roles this process hosts (every role without MPI) and, under MPI, its control actor.
Result<HostedRoles> spawn_roles(const actors::ExperimentConfig& cfg, const Placement& placement,
                                runtime::Cluster& cluster, std::unique_ptr<learner::Communicator> comm,
                                const std::vector<envs::EnvSpec>& specs, int rank_threads);

// ---- stop.cpp: signals and the end of a run ------------------------------------------------------

// One process: SIGTERM/SIGINT stop after the step in progress (a second one at once).
void install_stop_signals(bool hosts_coordinator);
// The cluster's on_first_signal under MPI: a graceful stop once arm_graceful_stop ran.
bool graceful_first_signal(int sig);
void arm_graceful_stop(runtime::ActorSystem* sys, int rank);
void disarm_graceful_stop();
// A signal asked the coordinator to stop after the step in progress.
bool stop_requested();
// Under MPI: the actor ("control") that takes StopAfterStep and StopRun on every rank.
Status spawn_control_actor(runtime::Cluster& cluster);
// Rank 0, the run over: every other rank stops serving; then this one shuts down.
void stop_other_ranks(runtime::Cluster& cluster, size_t ranks, int code);

// ---- coordinate.cpp ------------------------------------------------------------------------------

// Rank 0: creates the run directory, writes config.resolved.yaml, opens the metrics sinks and runs
// the coordinator over `peers`. The exit code (1: stopped by a signal, though checkpointed).
int coordinate_run(const actors::ExperimentConfig& cfg, const RunOptions& opt, int64_t resume_after,
                   const actors::RolePeers& peers, runtime::Cluster& cluster);

// ---- shared by the steps (run.cpp) ---------------------------------------------------------------

// Prints "troupe: error: ..." and returns the error's exit code.
int fail(const Error& e);
// The directory of the YAML file (relative paths in it are relative to that).
std::string base_dir_of(const std::string& file);

}  // namespace troupe::launch::run
