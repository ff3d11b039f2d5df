// MPI bootstrap (allgather of endpoints), signal-driven shutdown and the peer-failure watchdog.
// Invariant: once a shutdown is triggered the process ends within its bound — finish() or, if
// the program is stuck (e.g. in a collective with a dead rank), the watchdog's _Exit.
#include "troupe/runtime/cluster.h"

#include <fcntl.h>
#include <mpi.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "troupe/base/blocking_call.h"
#include "troupe/runtime/bind_host.h"

namespace troupe::runtime {

namespace {
std::atomic<int> g_signal_fd{-1};
void on_signal(int sig) {
  int fd = g_signal_fd.load();
  if (fd >= 0) {
    unsigned char b = static_cast<unsigned char>(sig);
    ssize_t n = ::write(fd, &b, 1);
    (void)n;
  }
}
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}
Status mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return {};
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  return make_error(ErrorCode::io, std::string("MPI: ") + what + " failed: " + std::string(buf, static_cast<std::size_t>(len)));
}
constexpr int kRecord = 512;  // endpoint (256) | curve key (64) | pid (as text, 32)
}  // namespace

Result<std::unique_ptr<Cluster>> Cluster::bootstrap(ClusterConfig config) {
  std::unique_ptr<Cluster> c(new Cluster());
  c->config_ = std::move(config);
  TROUPE_TRY(c->join_mpi());
  TROUPE_TRY(c->name_ranks());
  TROUPE_ASSIGN_OR_RETURN(SystemConfig sc, c->system_config());
  TROUPE_ASSIGN_OR_RETURN(c->system_, ActorSystem::create(sc));
  TROUPE_TRY(c->exchange_addresses());
  c->watch_peers();
  if (c->config_.install_signal_handlers) TROUPE_TRY(c->install_signal_handlers());
  Cluster* raw = c.get();
  c->watchdog_thread_ = std::thread([raw] { raw->watchdog_loop(); });
  c->bootstrapped_ = true;
  return c;
}

Status Cluster::join_mpi() {
  mpi_ = config_.force_mpi || launched_by_mpi();
  if (!mpi_) return {};
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    int wanted = config_.mpi_thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
    TROUPE_TRY(mpi_check(MPI_Init_thread(nullptr, nullptr, wanted, &provided), "MPI_Init_thread"));
    if (provided < wanted)
      return make_error(ErrorCode::io, "MPI: asked for thread level " + std::to_string(wanted) + ", the library provides " +
                                           std::to_string(provided));
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  return {};
}

Status Cluster::name_ranks() {
  for (int r = 0; r < world_; ++r)
    roles_.push_back(static_cast<std::size_t>(r) < config_.roles.size() && !config_.roles[r].empty() ? config_.roles[r]
                                                                                                     : "rank" + std::to_string(r));
  if (config_.roles.size() > static_cast<std::size_t>(world_))
    return invalid_input("runtime: the role table names " + std::to_string(config_.roles.size()) + " ranks but the job has " +
                         std::to_string(world_));
  return {};
}

Result<SystemConfig> Cluster::system_config() const {
  SystemConfig sc = config_.system;
  sc.node_id = static_cast<std::uint32_t>(rank_);
  sc.role = roles_[static_cast<std::size_t>(rank_)];
  if (world_ <= 1 && !config_.listen_when_alone) return sc;
  if (world_ > 1 && config_.transport == TransportKind::ipc) {
    sc.bind = "ipc://" + config_.ipc_dir + "/troupe-" + std::to_string(::getpid()) + "-r" + std::to_string(rank_);
    return sc;
  }
  auto host = resolve_bind_host(config_.tcp_host);  // on this node: a hostfile's ranks each resolve their own
  if (!host.ok())
    return invalid_input("runtime: rank " + std::to_string(rank_) + " (role " + roles_[static_cast<std::size_t>(rank_)] +
                         "): " + config_.tcp_host_name + ": " + host.error().message);
  sc.bind = "tcp://" + *host + ":*";
  return sc;
}

Status Cluster::exchange_addresses() {
  if (world_ <= 1) {
    book_.push_back(PeerInfo{0, system_->endpoint(), roles_[0], system_->curve_public_key()});
    return {};
  }
  std::vector<char> mine(kRecord, '\0'), all(static_cast<std::size_t>(kRecord) * world_, '\0');
  std::string ep = system_->endpoint(), key = system_->curve_public_key();
  std::snprintf(mine.data(), 256, "%s", ep.c_str());
  std::snprintf(mine.data() + 256, 64, "%s", key.c_str());
  std::snprintf(mine.data() + 320, 32, "%d", static_cast<int>(::getpid()));
  TROUPE_TRY(mpi_check(MPI_Allgather(mine.data(), kRecord, MPI_CHAR, all.data(), kRecord, MPI_CHAR, MPI_COMM_WORLD),
                       "MPI_Allgather of endpoints"));
  for (int r = 0; r < world_; ++r) {
    const char* rec = all.data() + static_cast<std::size_t>(r) * kRecord;
    book_.push_back(PeerInfo{static_cast<std::uint32_t>(r), std::string(rec, strnlen(rec, 256)),
                             roles_[static_cast<std::size_t>(r)], std::string(rec + 256, strnlen(rec + 256, 64))});
  }
  TROUPE_TRY(system_->connect(book_));
  return mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier after connect");
}

void Cluster::watch_peers() {
  system_->on_node_down([this](const NodeDown& d) {
    if (config_.survivable_loss && config_.survivable_loss(d.role)) {
      // a node beyond the MPI world (one that joined later over ZeroMQ) is no rank MPI_Finalize waits for
      const bool rank = d.node < static_cast<std::uint32_t>(world_);
      if (rank) lost_peer_ = true;
      std::fprintf(stderr, "troupe: rank %d (role %s): peer %s %u (role %s) failed: %s; the job goes on without it\n",
                   rank_, roles_[static_cast<std::size_t>(rank_)].c_str(), rank ? "rank" : "node", d.node,
                   d.role.c_str(), d.reason.c_str());
      std::fflush(stderr);
      return;
    }
    ShutdownInfo info;
    info.reason = ShutdownReason::peer_failed;
    info.failed_rank = static_cast<int>(d.node);
    info.failed_role = d.role;
    info.message = "troupe: rank " + std::to_string(rank_) + " (role " + roles_[static_cast<std::size_t>(rank_)] +
                   "): peer rank " + std::to_string(d.node) + " (role " + d.role + ") failed: " + d.reason;
    // What this rank waits in (a learner collective with the dead rank would never return).
    if (const std::string in = current_blocking_call(); !in.empty()) info.message += "; this rank was blocked in " + in;
    trigger(info);
  });
}

Status Cluster::install_signal_handlers() {
  if (::pipe(signal_pipe_) != 0) return make_error(ErrorCode::io, "runtime: pipe() for signal handling failed");
  ::fcntl(signal_pipe_[1], F_SETFL, O_NONBLOCK);
  g_signal_fd = signal_pipe_[1];
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal_thread_ = std::thread([this] { signal_loop(); });
  return {};
}

// The first signal may be a graceful stop the job finishes itself (on_first_signal), bounded by
// graceful_stop_bound; any other signal, or that bound passing, drains and stops.
void Cluster::signal_loop() {
  pollfd p{signal_pipe_[0], POLLIN, 0};
  std::optional<Clock::time_point> deferred_until;
  unsigned char deferred_signal = 0;
  auto stop = [this](unsigned char b, const std::string& how) {
    ShutdownInfo info;
    info.reason = ShutdownReason::signal;
    info.signal = b;
    info.message = "troupe: rank " + std::to_string(rank_) + " (role " + roles_[static_cast<std::size_t>(rank_)] +
                   "): got " + (b == SIGINT ? "SIGINT" : b == SIGTERM ? "SIGTERM" : "signal " + std::to_string(b)) + how;
    trigger(info);
  };
  while (!done_) {
    if (deferred_until && Clock::now() > *deferred_until) {
      deferred_until.reset();
      const auto bound_s = std::chrono::duration_cast<std::chrono::seconds>(config_.graceful_stop_bound).count();
      stop(deferred_signal, ": the graceful stop did not end within " + std::to_string(bound_s) + " s; draining and stopping");
    }
    if (::poll(&p, 1, 100) <= 0) continue;
    unsigned char b = 0;
    if (::read(signal_pipe_[0], &b, 1) != 1) continue;
    if (!deferred_until && !info_ready_ && config_.on_first_signal && config_.on_first_signal(b)) {
      deferred_until = Clock::now() + config_.graceful_stop_bound;
      deferred_signal = b;
      continue;
    }
    stop(b, ", draining and stopping");
  }
}

void Cluster::trigger(ShutdownInfo info) {
  {
    std::lock_guard lock(mu_);
    if (info_.reason != ShutdownReason::none) {
      // A peer failure outranks an earlier signal/request: the exit code must say a rank died.
      if (!(info.reason == ShutdownReason::peer_failed && info_.reason != ShutdownReason::peer_failed)) return;
    }
    info_ = info;
  }
  std::fprintf(stderr, "%s\n", info.message.c_str());
  std::fflush(stderr);
  info_ready_ = true;
  cv_.notify_all();
}

void Cluster::watchdog_loop() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_.load() || info_.reason != ShutdownReason::none; });
  if (done_) return;
  ShutdownInfo first = info_;
  auto bound = first.reason == ShutdownReason::peer_failed ? config_.peer_failure_grace : config_.shutdown_grace + std::chrono::seconds(1);
  auto deadline = Clock::now() + bound;
  // a peer failure arriving during a drain shortens the bound
  while (!done_ && Clock::now() < std::max(deadline, hold_until_)) {
    cv_.wait_until(lock, std::max(deadline, hold_until_));
    if (info_.reason == ShutdownReason::peer_failed && first.reason != ShutdownReason::peer_failed) {
      first = info_;
      deadline = std::min(deadline, Clock::now() + config_.peer_failure_grace);
    }
  }
  if (done_ || !config_.hard_exit_watchdog) return;
  int code = info_.reason == ShutdownReason::peer_failed ? 3 : 1;
  std::fprintf(stderr, "%s; watchdog: the process did not stop within %lld ms, exiting with code %d\n", info_.message.c_str(),
               static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(bound).count()), code);
  std::fflush(stderr);
  std::_Exit(code);
}

void Cluster::hold_exit(Duration d) {
  {
    std::lock_guard lock(mu_);
    hold_until_ = std::max(hold_until_, Clock::now() + d);
  }
  cv_.notify_all();
}

void Cluster::request_shutdown(const std::string& why) {
  ShutdownInfo info;
  info.reason = ShutdownReason::requested;
  info.message = "troupe: rank " + std::to_string(rank_) + ": shutdown requested: " + why;
  trigger(info);
}

ShutdownInfo Cluster::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return info_.reason != ShutdownReason::none; });
  return info_;
}

bool Cluster::wait_for(Duration d) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, d, [&] { return info_.reason != ShutdownReason::none; });
}

ShutdownInfo Cluster::info() const {
  std::lock_guard lock(mu_);
  return info_;
}

std::vector<int> Cluster::ranks_with_role(const std::string& role) const {
  std::vector<int> out;
  for (std::size_t r = 0; r < roles_.size(); ++r)
    if (roles_[r] == role) out.push_back(static_cast<int>(r));
  return out;
}

void Cluster::barrier() {
  if (mpi_ && world_ > 1) MPI_Barrier(MPI_COMM_WORLD);
}

std::vector<long> Cluster::allgather(long value) {
  std::vector<long> out(static_cast<std::size_t>(world_), value);
  if (mpi_ && world_ > 1) MPI_Allgather(&value, 1, MPI_LONG, out.data(), 1, MPI_LONG, MPI_COMM_WORLD);
  return out;
}

int Cluster::finish() {
  if (finished_) return info().exit_code();
  finished_ = true;
  ShutdownInfo in = info();
  system_->shutdown(in.reason == ShutdownReason::peer_failed ? Duration{0} : config_.shutdown_grace);
  if (mpi_ && in.reason != ShutdownReason::peer_failed && !lost_peer_) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  return in.exit_code();
}

Cluster::~Cluster() {
  if (!finished_ && system_) system_->shutdown(Duration{0});
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (signal_thread_.joinable()) signal_thread_.join();
  if (watchdog_thread_.joinable()) watchdog_thread_.join();
  if (signal_pipe_[0] >= 0) {
    g_signal_fd = -1;
    ::close(signal_pipe_[0]);
    ::close(signal_pipe_[1]);
  }
  // (not after a failed bootstrap: the other ranks may be in its MPI_Allgather, and MPI_Finalize
  // would wait for them; the caller aborts the job instead)
  if (mpi_ && bootstrapped_ && info().reason != ShutdownReason::peer_failed && !lost_peer_) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
}

}  // namespace troupe::runtime
