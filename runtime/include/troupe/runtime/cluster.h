// Process-level bootstrap for the launcher: under mpirun each rank binds its endpoint (ipc, or
// tcp on an ephemeral port of tcp_host, resolved on the rank's own node), allgathers addresses
// with MPI and connects; without MPI it is one node in one process. Also the shutdown/watchdog
// facility: SIGINT/SIGTERM drain and stop within a bound; a dead peer rank ends every surviving
// rank within a bound with exit code 3 and a message naming the dead rank and its role.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/runtime/system.h"
#include "troupe/runtime/transport_kind.h"

namespace troupe::runtime {

struct ClusterConfig {
  TransportKind transport = TransportKind::ipc;  // between ranks
  // An IPv4 address of the node or an interface name (resolve_bind_host, bind_host.h); a
  // non-loopback one needs system.allow_nonlocal_bind (and CURVE between hosts).
  std::string tcp_host = "127.0.0.1";
  std::string tcp_host_name = "tcp host";  // what errors about tcp_host call it (the launcher: its config key)
  std::string ipc_dir = "/tmp";
  std::vector<std::string> roles;  // role of each rank; missing entries are "rank<N>"
  // A job of one process binds tcp on tcp_host too (members that join later reach it there);
  // otherwise one process binds nothing.
  bool listen_when_alone = false;
  SystemConfig system;             // threads, mailboxes, heartbeat, curve; node_id/bind/role are set here
  Duration shutdown_grace = std::chrono::seconds(5);      // SIGINT/SIGTERM: drain at most this long
  Duration peer_failure_grace = std::chrono::seconds(2);  // after a peer is down: exit 3 by then at the latest
  bool install_signal_handlers = true;
  bool hard_exit_watchdog = true;  // if the process has not finished by the bound, _Exit (3 / 1) with the message
  bool force_mpi = false;          // call MPI_Init even when no launcher variables are seen
  bool mpi_thread_multiple = false;  // MPI_THREAD_MULTIPLE instead of MPI_THREAD_SERIALIZED
  // A dead rank whose role this returns true for does not end the job: it is reported, its
  // pending requests fail (peer_failed), and the job's code works around it (e.g. a generator
  // when others remain). MPI is then not finalized (a dead rank would hang MPI_Finalize).
  std::function<bool(const std::string& role)> survivable_loss;
  // A graceful stop: the first SIGINT/SIGTERM calls this (on the signal thread) instead of draining
  // and stopping; returning true defers the stop to the job (e.g. a final checkpoint, then
  // request_shutdown). A second signal, or `graceful_stop_bound` passing first, stops as usual.
  std::function<bool(int signal)> on_first_signal;
  Duration graceful_stop_bound = std::chrono::seconds(300);
};

enum class ShutdownReason { none, requested, signal, peer_failed };

struct ShutdownInfo {
  ShutdownReason reason = ShutdownReason::none;
  int signal = 0;
  int failed_rank = -1;
  std::string failed_role;
  std::string message;  // one line, names the dead rank and its role for peer_failed
  int exit_code() const { return reason == ShutdownReason::peer_failed ? 3 : 0; }
};

class Cluster {
 public:
  // MPI is used when launcher variables (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK) are present.
  // After an error MPI is left initialized, not finalized: the other ranks may be waiting in the
  // bootstrap's MPI_Allgather, so the caller ends the job (MPI_Abort) rather than this rank alone.
  static Result<std::unique_ptr<Cluster>> bootstrap(ClusterConfig config);
  ~Cluster();

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  bool under_mpi() const { return mpi_; }
  const std::string& role(int rank) const { return roles_.at(static_cast<std::size_t>(rank)); }
  const std::vector<std::string>& roles() const { return roles_; }
  std::vector<int> ranks_with_role(const std::string& role) const;
  ActorSystem& system() { return *system_; }
  const std::vector<PeerInfo>& address_book() const { return book_; }

  void request_shutdown(const std::string& why);
  // Keeps the process alive up to d beyond the watchdog's bound (a rank saving its work after a
  // peer failure); finishing sooner is fine. Calls extend, never shorten.
  void hold_exit(Duration d);
  bool shutdown_requested() const { return info_ready_.load(); }
  ShutdownInfo wait();                  // blocks until a signal, request_shutdown, or peer failure
  bool wait_for(Duration d);            // true when shutdown was triggered within d
  ShutdownInfo info() const;
  // Drains and stops the actor system within the grace, finalizes MPI (not after a peer failure:
  // collectives with a dead rank would hang). Returns the exit code for the launcher (0 or 3).
  int finish();

  // MPI helpers for tests and the launcher (no-ops without MPI).
  void barrier();
  std::vector<long> allgather(long value);

 private:
  Cluster() = default;
  void trigger(ShutdownInfo info);
  void watchdog_loop();
  // bootstrap's steps, in order.
  Status join_mpi();                           // rank and world size (1 without MPI)
  Status name_ranks();                         // roles_ from the role table
  Result<SystemConfig> system_config() const;  // this rank's actor system: node id, role, bind address
  Status exchange_addresses();                 // every rank's endpoint and CURVE key, then connect
  void watch_peers();                          // a failed peer shuts the job down unless its loss is survivable
  Status install_signal_handlers();            // SIGINT/SIGTERM -> signal_loop
  void signal_loop();

  ClusterConfig config_;
  int rank_ = 0, world_ = 1;
  bool mpi_ = false, finished_ = false;
  std::vector<std::string> roles_;
  std::vector<PeerInfo> book_;
  std::unique_ptr<ActorSystem> system_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  ShutdownInfo info_;
  std::atomic<bool> info_ready_{false};
  std::atomic<bool> done_{false};
  std::atomic<bool> lost_peer_{false};  // a survivable_loss rank died: MPI is not finalized
  bool bootstrapped_ = false;           // bootstrap() returned it; a failed one does not finalize MPI
  std::chrono::steady_clock::time_point hold_until_{};  // under mu_
  std::thread signal_thread_, watchdog_thread_;
  int signal_pipe_[2] = {-1, -1};
};

}  // namespace troupe::runtime
