// Stopping a run: in one process SIGTERM/SIGINT stop after the step in progress (install_stop_signals);
// under mpirun/srun the first signal on any rank is a graceful stop through rank 0 (StopAfterStep),
// and rank 0 ends every other rank when the run is over (StopRun). Each rank's "control" actor
// takes both. The coordinator polls stop_requested() between steps.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "run/steps.h"
#include "troupe/actors/messages.h"

namespace troupe::launch::run {
using actors::StopAfterStep;
using actors::StopRun;

namespace {

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

// Under mpirun/srun the first signal on any rank is a graceful stop (the cluster's
// on_first_signal): rank 0's coordinator finishes the step, checkpoints it and ends the run; the
// other ranks serve until then (at most cluster.graceful_stop_bound). Set once the actors exist.
struct GracefulStop {
  std::atomic<runtime::ActorSystem*> sys{nullptr};
  std::atomic<int> rank{-1};
};
GracefulStop g_graceful;

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

}  // namespace

void install_stop_signals(bool hosts_coordinator) {
  g_hosts_coordinator = hosts_coordinator ? 1 : 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

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

void arm_graceful_stop(runtime::ActorSystem* sys, int rank) {
  g_graceful.sys = sys;
  g_graceful.rank = rank;
}

void disarm_graceful_stop() {
  g_graceful.sys = nullptr;  // (the actor system goes with the cluster)
  g_graceful.rank = -1;
}

bool stop_requested() { return g_stop_signal.load(); }

Status spawn_control_actor(runtime::Cluster& cluster) {
  runtime::SpawnOptions so;
  so.name = "control";
  auto* cp = &cluster;
  auto id = cluster.system().spawn([cp]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<ControlActor>(cp); }, so);
  if (!id.ok()) return id.error();
  return {};
}

void stop_other_ranks(runtime::Cluster& cluster, size_t ranks, int code) {
  for (size_t r = 1; r < ranks; ++r)
    (void)cluster.system().send(runtime::ActorSystem::named(static_cast<uint32_t>(r), "control"), StopRun{code});
  cluster.request_shutdown(code == 0 ? "run finished" : "run failed");
}

}  // namespace troupe::launch::run
