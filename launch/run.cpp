// `troupe run` and `troupe eval`: place the roles (threads of one process, or MPI ranks from the
// `cluster` section), prepare the run directory, wire the metrics sinks and run the coordinator.
// Rank layout under mpirun: learners first (rank 0 also hosts the coordinator), then generators,
// then env workers; world size must equal learners + generators + env_workers.
#include "troupe/launch/run.h"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "troupe/actors/coordinator.h"
#include "troupe/actors/messages.h"
#include "troupe/actors/roles.h"
#include "troupe/launch/metrics.h"
#include "troupe/launch/rollout_serve.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/runtime/cluster.h"

namespace troupe::launch {
namespace fs = std::filesystem;
using actors::ExperimentConfig;
using json = nlohmann::json;
using actors::StopAfterStep;
using actors::StopRun;

namespace {

// The launcher, read from the environment before MPI_Init. mpirun (Open MPI) and srun with an MPI
// plugin (--mpi=pmix or pmi2) both give each task a PMI/PMIx rank; the variables are the ones
// runtime::Cluster checks (cluster.cpp launched_by_mpi), so both agree on whether this is MPI.
// SLURM_* alone is no MPI job: an sbatch script itself has SLURM_PROCID=0 and SLURM_NTASKS of the
// allocation, and a bare srun (MpiDefault=none) starts tasks that cannot form a world.
bool under_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

int env_int(const char* name, int dflt) {
  const char* s = std::getenv(name);
  return s && *s ? std::atoi(s) : dflt;
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

// SIGTERM / SIGINT during a one-process `troupe run`: the coordinator finishes the step in
// progress, checkpoints it and stops (exit 1); a second signal ends it at once. (Kept general:
// a rank that does not host the coordinator would wait for it, dying by SIGALRM after
// kFollowerGraceS; under mpirun the cluster's own handlers are used instead.)
std::atomic<bool> g_stop_signal{false};
volatile sig_atomic_t g_hosts_coordinator = 1;
constexpr unsigned kFollowerGraceS = 300;

void on_stop_signal(int sig) {
  if (g_stop_signal.exchange(true)) {  // the second one: the default action, now
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  if (!g_hosts_coordinator) {
    ::alarm(kFollowerGraceS);
    return;
  }
  const char msg[] = "troupe: signal received: stopping after the step in progress (send it again to stop now)\n";
  (void)!::write(2, msg, sizeof msg - 1);
}

void install_stop_signals(bool hosts_coordinator) {
  g_hosts_coordinator = hosts_coordinator ? 1 : 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int fail(const Error& e) {
  std::fprintf(stderr, "troupe: error: %s\n", e.message.c_str());
  return exit_code_for(e.code);
}

std::string base_dir_of(const std::string& file) {
  fs::path p(file);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

// Under mpirun/srun the first signal on any rank is a graceful stop (the cluster's
// on_first_signal): rank 0's coordinator finishes the step, checkpoints it and ends the run; the
// other ranks serve until then (at most cluster.graceful_stop_bound). Set once the actors exist.
struct GracefulStop {
  std::atomic<runtime::ActorSystem*> sys{nullptr};
  std::atomic<int> rank{-1};
};
GracefulStop g_graceful;

bool graceful_first_signal(int sig) {
  runtime::ActorSystem* sys = g_graceful.sys.load();
  const int rank = g_graceful.rank.load();
  if (!sys || rank < 0) return false;  // still starting up: stop as usual
  const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  if (rank == 0) {
    g_stop_signal = true;
    std::fprintf(stderr, "troupe: rank 0: %s: stopping after the step in progress, with a final checkpoint "
                 "(send it again to stop now)\n", name);
  } else {
    std::fprintf(stderr, "troupe: rank %d: %s: asking rank 0 to stop after the step in progress, with a final "
                 "checkpoint (send it again to stop now)\n", rank, name);
    (void)sys->send(runtime::ActorSystem::named(0, "control"), StopAfterStep{rank, sig});
  }
  std::fflush(stderr);
  return true;
}

class ControlActor : public runtime::Actor {
 public:
  explicit ControlActor(runtime::Cluster* c) : cluster_(c) {
    handle<StopRun>([this](runtime::Context&, const StopRun& m) {
      cluster_->request_shutdown(m.code == 0 ? "rank 0 finished the run" : "rank 0 failed the run");
    });
    handle<StopAfterStep>([](runtime::Context&, const StopAfterStep& m) {
      if (!g_stop_signal.exchange(true))
        std::fprintf(stderr, "troupe: rank 0: rank %d got %s: stopping after the step in progress, with a final "
                     "checkpoint\n", m.rank, m.signal == SIGINT ? "SIGINT" : "SIGTERM");
    });
  }

 private:
  runtime::Cluster* cluster_;
};

// Before a --resume touches the run directory (every rank checks, nothing is written): the
// checkpoint it continues from is whole, and the config is the run's own (config.resolved.yaml)
// up to the keys a resume may change. Exit code 2 with the reason otherwise; 0 with *step set to
// the checkpoint's step.
int check_resume(const LoadedConfig& loaded, const std::string& run_dir, int64_t* step) {
  const std::string ckpts = run_dir + "/checkpoints";
  auto latest = learner::latest_checkpoint(ckpts);
  if (!latest.ok()) {
    std::fprintf(stderr, "troupe: error: --resume %s: %s\n", run_dir.c_str(), latest.error().message.c_str());
    return 2;
  }
  auto state = learner::verify_checkpoint(*latest);
  if (!state.ok()) {
    // Name the earlier checkpoints that are whole, newest first: the run can go on from one of them.
    const auto steps = learner::checkpoint_steps(ckpts);
    std::error_code ec;
    std::string whole;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const std::string dir = ckpts + "/" + it->second;
      if (!fs::equivalent(dir, *latest, ec) && learner::verify_checkpoint(dir).ok())
        whole += (whole.empty() ? "" : ", ") + it->second;
    }
    std::fprintf(stderr,
                 "troupe: error: --resume %s: %s; nothing in the run directory was changed. %s\n", run_dir.c_str(),
                 state.error().message.c_str(),
                 whole.empty() ? "No earlier checkpoint is whole either."
                               : ("Earlier checkpoints that are whole: " + whole + "; to go on from the newest: ln -sfn " +
                                  whole.substr(0, whole.find(',')) + " " + ckpts + "/latest")
                                     .c_str());
    return 2;
  }
  *step = (*state)["step"].get<int64_t>();
  const std::string stored = run_dir + "/config.resolved.yaml";
  if (!fs::exists(stored)) {
    std::fprintf(stderr, "troupe: warning: --resume %s: no config.resolved.yaml, the config is not compared\n",
                 run_dir.c_str());
    return 0;
  }
  auto before = load_config(stored);
  if (!before.ok()) {
    std::fprintf(stderr, "troupe: error: --resume %s: the run's own config does not load:\n%s\n", run_dir.c_str(),
                 before.error().message.c_str());
    return 2;
  }
  auto diffs = resume_conflicts(before->config, loaded.config);
  if (diffs.empty()) return 0;
  std::string lines;
  for (const auto& d : diffs) {
    lines += "  " + d.key + ": " + d.before + " (the run) -> " + d.now + " (" + loaded.file + " and --set)\n";
  }
  std::fprintf(stderr,
               "troupe: error: --resume %s: %zu key(s) differ from %s, and they change what the run trains:\n%s"
               "Resume with the run's YAML and --set flags (config.resolved.yaml lists every value it used), or start "
               "a new run.dir. A resume may change: %s\n",
               run_dir.c_str(), diffs.size(), stored.c_str(), lines.c_str(), resume_may_change_summary().c_str());
  return 2;
}

struct Roles {
  std::vector<std::shared_ptr<actors::EnvWorker>> envs;
  std::vector<std::shared_ptr<actors::Generator>> gens;
  std::vector<int> gen_indices;  // gens[i] is generator gen_indices[i]
  std::vector<std::shared_ptr<actors::LearnerRole>> learners;
};

}  // namespace

Result<std::vector<std::string>> rank_roles(const ExperimentConfig& cfg) {
  std::vector<std::string> roles;
  for (int i = 0; i < cfg.cluster.learners; ++i) roles.push_back("learner" + std::to_string(i));
  for (int i = 0; i < cfg.cluster.generators; ++i) roles.push_back("generator" + std::to_string(i));
  for (int i = 0; i < cfg.cluster.env_workers; ++i) roles.push_back("env" + std::to_string(i));
  return roles;
}

int run_experiment(const LoadedConfig& loaded, const RunOptions& opt) {
  ExperimentConfig cfg = loaded.config;
  const bool mpi = under_mpi();
  auto roles_r = rank_roles(cfg);
  const auto& roles = *roles_r;
  if (!mpi && under_srun() && env_int("SLURM_STEP_NUM_TASKS", 1) > 1) {
    if (env_int("SLURM_PROCID", 0) == 0)
      std::fprintf(stderr,
                   "troupe: error: srun started %d tasks without an MPI plugin (no PMIx/PMI rank in the environment), "
                   "so they cannot form one job: run srun --mpi=pmix -n %zu (srun --mpi=list shows the plugins; "
                   "MpiDefault in slurm.conf sets the default)\n",
                   env_int("SLURM_STEP_NUM_TASKS", 1), roles.size());
    return 2;
  }
  if (mpi) {
    int n = world_size_from_env();
    if (n < 0) {  // a PMIx launcher that exports no size: ask MPI (initialized below anyway)
      int inited = 0;
      MPI_Initialized(&inited);
      if (!inited) {
        int provided = 0;
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      }
      MPI_Comm_size(MPI_COMM_WORLD, &n);
    }
    if (n != static_cast<int>(roles.size())) {
      auto m = loaded.mark_of("cluster.learners");
      std::fprintf(stderr,
                   "%s:%d:%d: error: cluster: the job has %d ranks but the cluster section places %zu roles "
                   "(learners %d + generators %d + env_workers %d); run %s %zu or change cluster\n",
                   loaded.file.c_str(), m.first, m.second, n, roles.size(), cfg.cluster.learners,
                   cfg.cluster.generators, cfg.cluster.env_workers, under_srun() ? "srun --mpi=pmix -n" : "mpirun -np",
                   roles.size());
      return 2;
    }
  } else if (cfg.cluster.learners > 1) {
    auto m = loaded.mark_of("cluster.learners");
    std::fprintf(stderr,
                 "%s:%d:%d: error: cluster.learners: %d data-parallel learners need one rank each: run under "
                 "mpirun -np %zu or srun --mpi=pmix -n %zu (one process runs a single learner)\n",
                 loaded.file.c_str(), m.first, m.second, cfg.cluster.learners, roles.size(), roles.size());
    return 2;
  }
  std::string run_dir = opt.resume_dir.empty() ? cfg.run.dir : opt.resume_dir;
  cfg.run.dir = run_dir;
  if (opt.resume_dir.empty() && fs::exists(run_dir + "/checkpoints/latest")) {
    auto m = loaded.mark_of("run.dir");
    std::fprintf(stderr,
                 "%s:%d:%d: error: run.dir: %s already holds a run; continue it with --resume %s or choose another "
                 "run.dir (--set run.dir=...)\n",
                 loaded.file.c_str(), m.first, m.second, run_dir.c_str(), run_dir.c_str());
    return 2;
  }
  if (!opt.resume_dir.empty() && !fs::exists(run_dir + "/checkpoints/latest")) {
    std::fprintf(stderr, "troupe: error: --resume %s: no checkpoints/latest in that run directory\n", run_dir.c_str());
    return 2;
  }
  int64_t resume_after = -1;  // the checkpoint's step: metric rows after it are dropped
  if (!opt.resume_dir.empty()) {
    if (int rc = check_resume(loaded, run_dir, &resume_after); rc != 0) return rc;
  }
  auto specs = actors::env_specs(cfg, base_dir_of(loaded.file));
  if (!specs.ok()) return fail(specs.error());
  // compute threads: as configured, else the cores shared by the ranks on this node
  int threads = cfg.cluster.threads;
  // (srun -c N / --cpus-per-task=N: N each)
  if (threads == 0 && mpi) {
    if (under_srun() && env_int("SLURM_CPUS_PER_TASK", 0) > 0)
      threads = env_int("SLURM_CPUS_PER_TASK", 1);
    else
      threads = std::max(1, omp_get_num_procs() / local_ranks_from_env());
  }
  if (threads > 0) omp_set_num_threads(threads);
  const int rank_threads = threads > 0 ? threads : omp_get_max_threads();

  // bootstrap (one node without MPI)
  runtime::ClusterConfig cc;
  cc.transport = cfg.cluster.transport;
  cc.tcp_host = cfg.cluster.bind_host;
  cc.tcp_host_name = "cluster.bind_host";
  if (mpi) cc.roles = roles;
  // One process: troupe run handles SIGTERM/SIGINT itself (install_stop_signals, a final
  // checkpoint); under mpirun/srun the cluster's handlers drain and stop every rank.
  cc.install_signal_handlers = mpi;
  cc.on_first_signal = graceful_first_signal;
  // A dead generator rank does not end the job while another generator lives: its prompts go to
  // the others (actors/rollout.cpp, generation_failover); the coordinator fails once none is left.
  if (cfg.cluster.generators >= 2)
    cc.survivable_loss = [](const std::string& role) { return role.rfind("generator", 0) == 0; };
  cc.system.threads = 3;
  cc.system.heartbeat.interval = std::chrono::milliseconds(static_cast<int64_t>(cfg.cluster.heartbeat_s * 1000));
  cc.system.heartbeat.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.cluster.peer_timeout_s * 1000));
  cc.system.allow_nonlocal_bind = cfg.cluster.bind_host != "127.0.0.1" && cfg.cluster.bind_host != "localhost";
  if (cfg.cluster.curve) {
    auto in_yaml_dir = [&](const std::string& p) {
      return fs::path(p).is_absolute() ? p : (fs::path(base_dir_of(loaded.file)) / p).string();
    };
    cc.system.curve = runtime::CurveConfig{true, in_yaml_dir(cfg.cluster.curve_public_key),
                                           in_yaml_dir(cfg.cluster.curve_secret_key),
                                           in_yaml_dir(cfg.cluster.curve_authorized_keys)};
  }
  if (mpi) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    }
  }
  auto cluster_r = runtime::Cluster::bootstrap(cc);
  if (!cluster_r.ok()) {
    const int code = fail(cluster_r.error());
    // the other ranks may be waiting in the bootstrap's MPI_Allgather (this rank alone could not
    // bind, e.g. a cluster.bind_host its node lacks): end the whole job, not just this rank
    if (mpi) MPI_Abort(MPI_COMM_WORLD, code);
    return code;
  }
  auto& cluster = **cluster_r;
  auto& sys = cluster.system();
  const int rank = cluster.rank();
  const bool single = !cluster.under_mpi();
  if (!single && rank == 0) {  // where every rank listens (each resolved cluster.bind_host on its own node)
    std::string where;
    for (const auto& p : cluster.address_book())
      where += (where.empty() ? "" : ", ") + std::to_string(p.node) + " " + p.role + " at " + p.endpoint;
    std::fprintf(stderr, "troupe: %d ranks: %s\n", cluster.world_size(), where.c_str());
  }

  // The learners' own communicator (a split of the world; only learner ranks are in it).
  std::unique_ptr<learner::Communicator> comm;
  if (!single) {
    MPI_Comm learners_comm = MPI_COMM_NULL;
    bool is_learner = rank < cfg.cluster.learners;
    MPI_Comm_split(MPI_COMM_WORLD, is_learner ? 0 : MPI_UNDEFINED, rank, &learners_comm);
    if (is_learner) {
      auto c = learner::make_mpi_communicator(&learners_comm);
      if (!c.ok()) return fail(c.error());
      comm = std::move(c).value();
    }
  }

  // Spawn the roles this process hosts (every role without MPI).
  actors::RolePeers peers;
  peers.system = &sys;
  Roles hosted;
  for (size_t r = 0; r < roles.size(); ++r) {
    const std::string& role = roles[r];
    auto node = static_cast<uint32_t>(single ? 0 : r);
    runtime::ActorId addr = runtime::ActorSystem::named(node, role);
    if (single || static_cast<int>(r) == rank) {
      runtime::ActorFactory factory;
      if (role.rfind("learner", 0) == 0) {
        auto l = actors::LearnerRole::create(cfg, std::move(comm));
        if (!l.ok()) return fail(l.error());
        std::shared_ptr<actors::LearnerRole> sp = std::move(l).value();
        hosted.learners.push_back(sp);
        const int n = actors::role_threads(cfg.cluster, "learner", rank_threads);
        factory = [sp, n]() -> std::unique_ptr<runtime::Actor> {
          return std::make_unique<actors::LearnerActor>(sp, n);
        };
      } else if (role.rfind("generator", 0) == 0) {
        auto g = actors::Generator::create(cfg);
        if (!g.ok()) return fail(g.error());
        std::shared_ptr<actors::Generator> sp = std::move(g).value();
        hosted.gens.push_back(sp);
        hosted.gen_indices.push_back(std::stoi(role.substr(9)));
        const int n = actors::role_threads(cfg.cluster, "generator", rank_threads);
        const int nice = cfg.cluster.generator_nice;
        const int index = hosted.gen_indices.back();
        const bool own_process = !single;
        factory = [sp, n, nice, index, own_process]() -> std::unique_ptr<runtime::Actor> {
          return std::make_unique<actors::GeneratorActor>(sp, n, nice, index, own_process);
        };
      } else {
        auto e = actors::EnvWorker::create(*specs, role);
        if (!e.ok()) return fail(e.error());
        std::shared_ptr<actors::EnvWorker> sp = std::move(e).value();
        hosted.envs.push_back(sp);
        factory = [sp]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<actors::EnvActor>(sp); };
      }
      runtime::SpawnOptions so;
      so.name = role;
      auto id = sys.spawn(factory, so);
      if (!id.ok()) return fail(id.error());
      if (single) addr = *id;
    }
    if (role.rfind("learner", 0) == 0) peers.learners.push_back(addr);
    else if (role.rfind("generator", 0) == 0) peers.generators.push_back(addr);
    else peers.env_workers.push_back(addr);
  }
  if (!single) {
    runtime::SpawnOptions so;
    so.name = "control";
    auto* cp = &cluster;
    auto id = sys.spawn([cp]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<ControlActor>(cp); }, so);
    if (!id.ok()) return fail(id.error());
  }
  // rollout.serve: every hosted generator's OpenAI-compatible endpoint listens before the run starts
  auto serving = RolloutServers::start(cfg, hosted.gens, hosted.gen_indices);
  if (!serving.ok()) return fail(serving.error());
  cluster.barrier();  // every rank's actors exist before the coordinator sends
  if (single) install_stop_signals(true);
  if (!single) {
    g_graceful.sys = &sys;
    g_graceful.rank = rank;
  }

  int code = 0;
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec) {
      std::fprintf(stderr, "troupe: error: cannot create run.dir %s: %s\n", run_dir.c_str(), ec.message().c_str());
      code = 1;
    } else {
      std::ofstream(run_dir + "/config.resolved.yaml") << resolved_yaml(cfg);
      ProgressOptions po{cfg.logger.progress, cfg.run.name,
                         (cfg.sft.enabled ? cfg.sft.max_steps : 0) + (cfg.grpo.enabled ? cfg.grpo.max_steps : 0)};
      auto sinks = MetricsSinks::open(run_dir, cfg.logger.tensorboard, po, resume_after);
      if (!sinks.ok()) {
        code = fail(sinks.error());
      } else {
        auto* s = sinks->get();
        actors::CoordinatorHooks hooks;
        hooks.metrics = [s](const json& row) { return s->write(row); };
        hooks.log = [s](const std::string& line) { s->message(line); };
        hooks.hold_exit = [&cluster](std::chrono::seconds d) { cluster.hold_exit(d); };
        hooks.stop_requested = [] { return g_stop_signal.load(); };
        Status st = actors::run_coordinator(cfg, peers, hooks, run_dir, !opt.resume_dir.empty());
        s->finish();
        if (!st.ok() && actors::is_planned_stop(st.error())) {
          s->message(st.error().message);  // a planned stop, checkpointed: not a failure
          if (st.error().message.rfind(actors::kStoppedBySignal, 0) == 0) code = 1;  // but not finished either
        } else if (!st.ok()) {
          code = fail(st.error());
        } else {
          s->message("done: " + run_dir + "/metrics.jsonl");
        }
      }
    }
    if (!single) {
      for (size_t r = 1; r < roles.size(); ++r)
        (void)sys.send(runtime::ActorSystem::named(static_cast<uint32_t>(r), "control"), StopRun{code});
      cluster.request_shutdown(code == 0 ? "run finished" : "run failed");
    }
  } else {
    cluster.wait();  // serve until rank 0 ends the run (or a peer fails)
  }
  g_graceful.sys = nullptr;  // (the actor system goes with the cluster)
  g_graceful.rank = -1;
  int fin = cluster.finish();
  return code != 0 ? code : fin;
}

int eval_checkpoint(const LoadedConfig& loaded, const std::string& checkpoint) {
  ExperimentConfig cfg = loaded.config;
  cfg.policy.path = checkpoint;
  cfg.policy.tokenizer = actors::TokenizerKind::from_model;
  auto specs = actors::env_specs(cfg, base_dir_of(loaded.file));
  if (!specs.ok()) return fail(specs.error());
  runtime::SystemConfig sc;
  sc.threads = 2;
  auto sys_r = runtime::ActorSystem::create(sc);
  if (!sys_r.ok()) return fail(sys_r.error());
  auto& sys = **sys_r;
  auto g = actors::Generator::create(cfg);
  if (!g.ok()) return fail(g.error());
  auto e = actors::EnvWorker::create(*specs);
  if (!e.ok()) return fail(e.error());
  std::shared_ptr<actors::Generator> gp = std::move(g).value();
  std::shared_ptr<actors::EnvWorker> ep = std::move(e).value();
  auto gid = sys.spawn([gp]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<actors::GeneratorActor>(gp); });
  auto eid = sys.spawn([ep]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<actors::EnvActor>(ep); });
  if (!gid.ok()) return fail(gid.error());
  if (!eid.ok()) return fail(eid.error());
  actors::RolePeers peers{&sys, {*eid}, {*gid}, {}};
  auto r = actors::evaluate_policy(cfg, peers);
  sys.shutdown();
  if (!r.ok()) return fail(r.error());
  json out = *r;
  out["checkpoint"] = checkpoint;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace troupe::launch
