// Step 5 of `troupe run`: this process's cluster from the `cluster` section (transport, bind host,
// heartbeats, CURVE keys relative to the YAML), its bootstrap (one node without MPI), and the
// learners' own MPI communicator. A dead generator (or scorer) rank is a survivable loss while another lives.
// Every rank's receiving socket is bounded by the model's size (cluster_max_message_bytes).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "run/steps.h"

namespace troupe::launch::run {
namespace fs = std::filesystem;

namespace {

// An upper bound on the parameters of policy.model (a MoE layer counted with every expert and its
// dense size too; biases and norms in the headroom).
double estimated_parameters(const policy::ModelArchitecture& m) {
  const double c = m.hidden_size, q = double(m.num_attention_heads) * m.head_dim,
               kv = double(m.num_key_value_heads) * m.head_dim;
  const double mlp = 3 * c * (m.intermediate_size + double(m.num_experts) * m.moe_intermediate_size +
                              m.shared_expert_intermediate_size) + c * m.num_experts;
  const double layer = 2 * c * q + 2 * c * kv + mlp + 2 * c + 2 * double(m.head_dim) + q + 2 * kv + c;
  return double(m.vocab_size) * c * (m.tie_word_embeddings ? 1 : 2) + m.num_hidden_layers * layer + c;
}

// Bytes of the model files at `p` (a file, or a directory's top-level files); 0 when not there.
double bytes_on_disk(const fs::path& p) {
  std::error_code ec;
  double on_disk = 0;
  if (fs::is_regular_file(p, ec)) return double(fs::file_size(p, ec));
  if (fs::is_directory(p, ec))
    for (const auto& f : fs::directory_iterator(p, ec))
      if (f.is_regular_file(ec)) on_disk += double(f.file_size(ec));
  return on_disk;
}

// The largest message part a rank accepts from another: twice the full weights in fp32 plus
// 64 MiB, at least 256 MiB. With policy.path the weights' size comes from its files on disk
// (8 bytes per byte there: a 4-bit .gguf still fits as fp32), else from policy.model; a
// policy.path not found here (as given, or from the YAML's folder) leaves the ranks unbounded.
std::int64_t cluster_max_message_bytes(const LoadedConfig& loaded, const actors::ExperimentConfig& cfg) {
  double weights = 4 * estimated_parameters(cfg.policy.model);
  if (!cfg.policy.path.empty()) {
    double on_disk = bytes_on_disk(cfg.policy.path);
    if (on_disk <= 0 && fs::path(cfg.policy.path).is_relative())
      on_disk = bytes_on_disk(fs::path(base_dir_of(loaded.file)) / cfg.policy.path);
    if (on_disk <= 0) return -1;
    weights = 8 * on_disk;
  }
  const double bound = std::max(256.0 * (1 << 20), 2 * weights + 64.0 * (1 << 20));
  return bound >= 9e18 ? -1 : static_cast<std::int64_t>(bound);
}

runtime::ClusterConfig cluster_config(const LoadedConfig& loaded, const actors::ExperimentConfig& cfg,
                                      const Launcher& launcher, const Placement& placement) {
  const bool mpi = launcher.mpi;
  // bootstrap (one node without MPI)
  runtime::ClusterConfig cc;
  cc.transport = cfg.cluster.transport;
  cc.tcp_host = cfg.cluster.bind_host;
  cc.tcp_host_name = "cluster.bind_host";
  if (mpi)
    for (const auto& role : placement) cc.roles.push_back(role.name);
  // One process: troupe run handles SIGTERM/SIGINT itself (install_stop_signals, a final
  // checkpoint); under mpirun/srun the cluster's handlers drain and stop every rank.
  cc.install_signal_handlers = mpi;
  cc.on_first_signal = graceful_first_signal;
  // A dead generator rank does not end the job while another generator lives: its prompts go to
  // the others (actors/rollout.cpp, generation_failover); the coordinator fails once none is left.
  // So does a dead scorer rank while another scorer lives: its requests are retried on the next one
  // (teacher_scores.cpp, ScorerClient), each such failure counted.
  // With cluster.join a member that joined (role "joined-...") may die or leave at any time: the
  // coordinator generates its work again on the others (membership.cpp), the job goes on.
  const bool spare_generators = cfg.cluster.generators >= 2, spare_scorers = cfg.cluster.scorers >= 2;
  const bool members = cfg.cluster.join;
  cc.listen_when_alone = members;
  if (spare_generators || spare_scorers || members)
    cc.survivable_loss = [placement, spare_generators, spare_scorers](const std::string& role) {
      if (role.rfind("joined-", 0) == 0) return true;
      for (const auto& r : placement)
        if (r.name == role)
          return (spare_generators && r.kind == RoleKind::generator) || (spare_scorers && r.kind == RoleKind::scorer);
      return false;
    };
  cc.system.threads = 3;
  cc.system.max_message_bytes = cluster_max_message_bytes(loaded, cfg);
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
  return cc;
}

}  // namespace

int start_cluster(const LoadedConfig& loaded, const actors::ExperimentConfig& cfg, const Launcher& launcher,
                  const Placement& placement, std::unique_ptr<runtime::Cluster>* out) {
  runtime::ClusterConfig cc = cluster_config(loaded, cfg, launcher, placement);
  if (launcher.mpi) ensure_mpi_initialized();
  auto cluster_r = runtime::Cluster::bootstrap(cc);
  if (!cluster_r.ok()) {
    const int code = fail(cluster_r.error());
    // the other ranks may be waiting in the bootstrap's MPI_Allgather (this rank alone could not
    // bind, e.g. a cluster.bind_host its node lacks): end the whole job, not just this rank
    if (launcher.mpi) MPI_Abort(MPI_COMM_WORLD, code);
    return code;
  }
  *out = std::move(cluster_r).value();
  runtime::Cluster& cluster = **out;
  if (cluster.under_mpi() && cluster.rank() == 0) {  // where every rank listens (each resolved cluster.bind_host on its own node)
    std::string where;
    for (const auto& p : cluster.address_book())
      where += (where.empty() ? "" : ", ") + std::to_string(p.node) + " " + p.role + " at " + p.endpoint;
    std::fprintf(stderr, "troupe: %d ranks: %s\n", cluster.world_size(), where.c_str());
  }
  return 0;
}

Result<std::unique_ptr<learner::Communicator>> learners_communicator(runtime::Cluster& cluster, int learners) {
  std::unique_ptr<learner::Communicator> comm;
  if (!cluster.under_mpi()) return comm;
  MPI_Comm learners_comm = MPI_COMM_NULL;
  const int rank = cluster.rank();
  const bool is_learner = rank < learners;
  MPI_Comm_split(MPI_COMM_WORLD, is_learner ? 0 : MPI_UNDEFINED, rank, &learners_comm);
  if (is_learner) {
    TROUPE_ASSIGN_OR_RETURN(comm, learner::make_mpi_communicator(&learners_comm));
  }
  return comm;
}

}  // namespace troupe::launch::run
