// mpirun integration probe for the runtime: `runtime_mpi_probe MODE TRANSPORT` on every rank.
// MODE: pingpong | broadcast | kill (rank 1 is SIGKILLed) | stall (rank 1 stops answering) |
// sigterm (rank 0 sends SIGTERM to every rank). Prints "PROBE rank R: ..." lines the tests match.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "troupe/runtime/cluster.h"

using namespace troupe::runtime;
using namespace std::chrono_literals;

namespace {
struct Ping {
  static constexpr std::uint32_t type_id = 9501;
  std::uint64_t seq = 0;
  std::string body;
  template <class A>
  void serialize(A& ar) { ar(seq, body); }
};
struct Pong {
  static constexpr std::uint32_t type_id = 9502;
  std::uint64_t seq = 0;
  std::int32_t rank = 0;
  template <class A>
  void serialize(A& ar) { ar(seq, rank); }
};
struct Note {
  static constexpr std::uint32_t type_id = 9503;
  std::int32_t rank = 0;
  std::int64_t count = 0;
  template <class A>
  void serialize(A& ar) { ar(rank, count); }
};
struct Done {
  static constexpr std::uint32_t type_id = 9504;
  template <class A>
  void serialize(A&) {}
};

int fail(int rank, const std::string& why) {
  std::printf("PROBE rank %d: FAILED: %s\n", rank, why.c_str());
  std::fflush(stdout);
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: runtime_mpi_probe pingpong|broadcast|kill|stall|sigterm ipc|tcp\n");
    return 2;
  }
  std::string mode = argv[1];
  ClusterConfig cfg;
  const auto transport = troupe::enum_from_name<TransportKind>(argv[2]);
  if (!transport) {
    std::fprintf(stderr, "runtime_mpi_probe: transport must be ipc or tcp, got '%s'\n", argv[2]);
    return 2;
  }
  cfg.transport = *transport;
  cfg.roles = {"coordinator", "learner", "generator", "env"};
  cfg.system.threads = 1;
  cfg.system.heartbeat = HeartbeatConfig{.interval = 100ms, .timeout = 1000ms};
  cfg.shutdown_grace = 3s;
  cfg.peer_failure_grace = 2s;
  auto boot = Cluster::bootstrap(cfg);
  if (!boot.ok()) {
    std::fprintf(stderr, "bootstrap: %s\n", boot.error().message.c_str());
    return 1;
  }
  Cluster& cl = **boot;
  ActorSystem& sys = cl.system();
  const int rank = cl.rank(), world = cl.world_size();
  if (world < 2) return fail(rank, "needs mpirun -np >= 2");
  std::atomic<long> received{0};

  // every rank: an echo actor, a sink counting broadcasts, a control actor that ends the run
  (void)sys.spawn([rank] {
    auto a = std::make_unique<Actor>();
    a->handle<Ping>([rank](Context& ctx, const Ping& p) {
      if (ctx.header()->flags & kFlagRequest) (void)ctx.reply(Pong{p.seq, rank});
    });
    return a;
  }, SpawnOptions().named("echo"));
  (void)sys.spawn([&] {
    auto a = std::make_unique<Actor>();
    a->handle<Ping>([&](Context& ctx, const Ping&) {
      if (++received == 50) (void)ctx.send(ActorSystem::named(0, "collector"), Note{rank, received.load()});
    });
    return a;
  }, SpawnOptions().named("sink"));
  (void)sys.spawn([&] {
    auto a = std::make_unique<Actor>();
    a->handle<Done>([&](Context&, const Done&) { cl.request_shutdown("probe finished"); });
    return a;
  }, SpawnOptions().named("ctl"));
  std::atomic<int> notes{0};
  if (rank == 0)
    (void)sys.spawn([&] {
      auto a = std::make_unique<Actor>();
      a->handle<Note>([&](Context&, const Note& n) {
        if (n.count == 50) ++notes;
      });
      return a;
    }, SpawnOptions().named("collector"));
  std::vector<long> pids = cl.allgather(static_cast<long>(::getpid()));
  cl.barrier();  // every rank's actors exist before anyone sends

  std::vector<ActorId> ctl;
  for (int r = 0; r < world; ++r) ctl.push_back(ActorSystem::named(static_cast<std::uint32_t>(r), "ctl"));

  if (mode == "pingpong" && rank == 0) {
    for (int r = 1; r < world; ++r)
      for (int i = 0; i < 100; ++i) {
        auto rep = sys.ask<Pong>(ActorSystem::named(static_cast<std::uint32_t>(r), "echo"), Ping{std::uint64_t(i), std::string(i * 10, 'x')}, 5s).get();
        if (!rep.ok()) return fail(rank, rep.error().message);
        if (rep->seq != std::uint64_t(i) || rep->rank != r) return fail(rank, "wrong pong");
      }
    std::printf("PROBE rank 0: pingpong ok with %d peers over %s\n", world - 1, argv[2]);
    (void)sys.broadcast(ctl, Done{});
  } else if (mode == "broadcast" && rank == 0) {
    std::vector<ActorId> sinks;
    for (int r = 0; r < world; ++r) sinks.push_back(ActorSystem::named(static_cast<std::uint32_t>(r), "sink"));
    for (int i = 0; i < 50; ++i)
      if (auto st = sys.broadcast(sinks, Ping{std::uint64_t(i), "b"}); !st.ok()) return fail(rank, st.error().message);
    auto t0 = Clock::now();
    while (notes < world && Clock::now() - t0 < 10s) std::this_thread::sleep_for(5ms);
    if (notes != world) return fail(rank, "only " + std::to_string(notes.load()) + " ranks confirmed 50 broadcasts");
    std::printf("PROBE rank 0: broadcast ok: %d ranks got 50 messages each over %s\n", world, argv[2]);
    (void)sys.broadcast(ctl, Done{});
  } else if ((mode == "kill" || mode == "stall") && rank == 1) {
    std::this_thread::sleep_for(300ms);
    std::printf("PROBE rank 1: %s myself now\n", mode == "kill" ? "killing" : "stopping");
    std::fflush(stdout);
    ::raise(mode == "kill" ? SIGKILL : SIGSTOP);
  } else if (mode == "sigterm" && rank == 0) {
    std::this_thread::sleep_for(300ms);
    for (long pid : pids) ::kill(static_cast<pid_t>(pid), SIGTERM);
  }

  ShutdownInfo info = cl.wait();
  auto t_stop = Clock::now();
  int code = cl.finish();
  long ms = static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t_stop).count());
  if (info.reason == ShutdownReason::peer_failed)
    std::printf("PROBE rank %d: peer rank %d (role %s) detected dead; exit %d\n", rank, info.failed_rank, info.failed_role.c_str(), code);
  else if (info.reason == ShutdownReason::signal)
    std::printf("PROBE rank %d: clean shutdown after signal %d, stopped in %ld ms; exit %d\n", rank, info.signal, ms, code);
  else
    std::printf("PROBE rank %d: finished (%s); exit %d\n", rank, info.message.c_str(), code);
  std::fflush(stdout);
  return code;
}
