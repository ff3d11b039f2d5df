// `troupe bench runtime`: actor messaging against raw ZeroMQ (stream, rtt), actor calls against
// Ray (calls_*), and the envelope codec against memcpy (codec_4KiB). Ours and each baseline run
// interleaved in this process; every figure is a median of >= 5 repetitions (>= 9 for stream_*).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "troupe/bench/bench.h"
#include "troupe/base/build_config.h"
#include "troupe/base/message_ids.h"
#include "troupe/runtime/system.h"

extern char** environ;

namespace troupe::bench {
namespace {

using namespace troupe::runtime;
using namespace std::chrono_literals;
const char* kSuite = "runtime";

// A message of raw bytes; Blob (sent one way) and Call (asked and answered) are two types of it.
// The field is a runtime::Bytes, as a message carrying bulk data should be: a long run arrives
// as a view into the received ZeroMQ message, like raw ZeroMQ's zmq::message_t (no copy).
template <std::uint32_t Id, const char* Name>
struct RawBytes {
  static constexpr std::uint32_t type_id = Id;
  static constexpr const char* type_name = Name;
  Bytes data;
  template <class A>
  void serialize(A& ar) { ar(data); }
};
constexpr char kBlobName[] = "bench.Blob";
constexpr char kCallName[] = "bench.Call";
using Blob = RawBytes<message_id::bench_blob, kBlobName>;
using Call = RawBytes<message_id::bench_call, kCallName>;
struct TrajectoryMsg {  // 4 KiB trajectory-like: 500 tokens + 500 log-probs + scalars
  static constexpr std::uint32_t type_id = message_id::bench_trajectory;
  static constexpr const char* type_name = "bench.Trajectory";
  std::uint64_t episode = 0;
  std::int32_t policy_version = 0;
  std::vector<std::int32_t> tokens;
  std::vector<float> logprobs;
  float reward = 0;
  template <class A>
  void serialize(A& ar) { ar(episode, policy_version, tokens, logprobs, reward); }
};

struct RttGo {  // tells the round-trip client how many round trips to make
  static constexpr std::uint32_t type_id = message_id::bench_rtt_go;
  static constexpr const char* type_name = "bench.RttGo";
  long n = 0;
  template <class A>
  void serialize(A& ar) { ar(n); }
};

std::string size_name(std::size_t s) {
  if (s >= (1u << 20)) return std::to_string(s >> 20) + "MiB";
  if (s >= 1024) return std::to_string(s >> 10) + "KiB";
  return std::to_string(s) + "B";
}

// ---- a receiving actor that counts and signals when a target is reached ----
// `n` is written by the sink for every message: on a cache line of its own, or the sender's
// reads of its neighbours (the systems, the sink's id) would bounce between the two cores with
// every message (raw ZeroMQ's receiver counts in a register).
struct Counter {
  alignas(64) std::atomic<long> n{0};
  alignas(64) std::atomic<long> target{-1};
  std::atomic<bool> hit{false};
  void reset(long t) {
    n = 0;
    hit = false;
    target = t;
  }
  void wait() {
    while (!hit.load(std::memory_order_acquire)) std::this_thread::yield();
  }
};
std::unique_ptr<Actor> sink_actor(Counter* c) {
  auto a = std::make_unique<Actor>();
  a->handle<Blob>([c](Context&, const Blob&) {
    if (c->n.fetch_add(1, std::memory_order_relaxed) + 1 == c->target.load(std::memory_order_relaxed)) c->hit.store(true, std::memory_order_release);
  });
  a->handle<Call>([](Context& ctx, const Call& m) { (void)ctx.reply(Call{m.data}); });
  return a;
}

// The client of ours' remote round trips: an actor on node 0 that asks the sink with
// ctx.request and asks again from the reply's continuation — how troupe's actors talk (the
// coordinator to generators, learners, env workers).
struct RttClient : Actor {
  ActorId sink;
  std::atomic<bool>* done;
  long left = 0;
  std::string body = std::string(64, 'r');
  RttClient(ActorId s, std::atomic<bool>* d) : sink(s), done(d) {
    handle<RttGo>([this](Context& ctx, const RttGo& go) {
      left = go.n;
      next(ctx);
    });
  }
  void next(Context& ctx) {
    if (left-- <= 0) {
      done->store(true, std::memory_order_release);
      return;
    }
    ctx.request<Call>(sink, Call{body}, 10s, [this](Context& c, Result<Call>) { next(c); });
  }
};

// Ours: node 0 sends, the sink lives on node 0 (inproc: direct hand-off) or on node 1 (ipc/tcp).
struct OurPair {
  std::unique_ptr<ActorSystem> a, b;
  ActorId sink, client;
  std::atomic<bool> client_done{false};
  Counter counter;
  bool ok = false;
  std::string error;
  explicit OurPair(const std::string& transport) {
    SystemConfig ca, cb;
    ca.node_id = 0;
    cb.node_id = 1;
    ca.threads = cb.threads = 1;
    ca.heartbeat.interval = cb.heartbeat.interval = 0ms;
    ca.hwm = cb.hwm = 1000;
    ca.mailbox_capacity = cb.mailbox_capacity = 1000;
    std::string pid = std::to_string(::getpid());
    if (transport == "ipc") {
      ca.bind = "ipc:///tmp/troupe-bench-" + pid + "-a";
      cb.bind = "ipc:///tmp/troupe-bench-" + pid + "-b";
    } else if (transport == "tcp") {
      ca.bind = cb.bind = "tcp://127.0.0.1:*";
    }
    auto ra = ActorSystem::create(ca);
    if (!ra.ok()) {
      error = ra.error().message;
      return;
    }
    a = std::move(ra).value();
    if (transport == "inproc") {
      auto s = a->spawn([this] { return sink_actor(&counter); });
      if (!s.ok()) {
        error = s.error().message;
        return;
      }
      sink = *s;
    } else {
      auto rb = ActorSystem::create(cb);
      if (!rb.ok()) {
        error = rb.error().message;
        return;
      }
      b = std::move(rb).value();
      std::vector<PeerInfo> t = {{0, a->endpoint(), "bench-a", ""}, {1, b->endpoint(), "bench-b", ""}};
      if (auto st = a->connect(t); !st.ok()) {
        error = st.error().message;
        return;
      }
      if (auto st = b->connect(t); !st.ok()) {
        error = st.error().message;
        return;
      }
      auto s = b->spawn([this] { return sink_actor(&counter); });
      if (!s.ok()) {
        error = s.error().message;
        return;
      }
      sink = *s;
    }
    auto c = a->spawn([this] { return std::make_unique<RttClient>(sink, &client_done); });
    if (!c.ok()) {
      error = c.error().message;
      return;
    }
    client = *c;
    auto warm = a->ask<Call>(sink, Call{"warm"}, 10s).get();
    if (!warm.ok()) {
      error = warm.error().message;
      return;
    }
    ok = true;
  }
  double stream(std::size_t size, long n, const std::string& src) {
    counter.reset(n);
    return n / time_s([&] {
             for (long i = 0; i < n; ++i) (void)a->send(sink, Blob{Bytes(src.data(), size)});
             counter.wait();
           });
  }
  // Round trips asked from outside any actor: each reply hands a std::future over to this thread.
  double ask_get_us(long n) {
    std::string body(64, 'r');
    return 1e6 * time_s([&] {
             for (long i = 0; i < n; ++i) (void)a->ask<Call>(sink, Call{body}, 10s).get();
           }) / n;
  }
  // Actor to actor (RttClient on node 0, the sink on node 1).
  double actor_rtt_us(long n) {
    client_done = false;
    return 1e6 * time_s([&] {
             (void)a->send(client, RttGo{n});
             while (!client_done.load(std::memory_order_acquire)) std::this_thread::yield();
           }) / n;
  }
  double calls(long n, bool pipelined) {
    std::string body(1024, 'c');
    return n / time_s([&] {
             if (pipelined) {
               std::vector<std::future<Result<Call>>> fs;
               fs.reserve(static_cast<std::size_t>(n));
               for (long i = 0; i < n; ++i) fs.push_back(a->ask<Call>(sink, Call{body}, 30s));
               for (auto& f : fs) (void)f.get();
             } else {
               for (long i = 0; i < n; ++i) (void)a->ask<Call>(sink, Call{body}, 30s).get();
             }
           });
  }
};

// Raw ZeroMQ: PUSH/PULL stream and PAIR echo between the caller and one thread, same HWM.
struct RawPair {
  zmq::context_t ctx_a{1}, ctx_b{1};
  std::string transport;
  std::string endpoint;
  explicit RawPair(std::string t) : transport(std::move(t)) {}
  zmq::context_t& far_ctx() { return transport == "inproc" ? ctx_a : ctx_b; }
  int uses = 0;
  std::string bind_addr(std::string tag) {
    tag += std::to_string(++uses);  // a closed socket's name is released asynchronously: never reuse one
    if (transport == "inproc") return "inproc://raw-" + tag;
    if (transport == "ipc") return "ipc:///tmp/troupe-bench-raw-" + std::to_string(::getpid()) + "-" + tag;
    return "tcp://127.0.0.1:*";
  }
  double stream(std::size_t size, long n, const std::string& src) {
    zmq::socket_t pull(far_ctx(), zmq::socket_type::pull);
    pull.set(zmq::sockopt::rcvhwm, 1000);
    pull.bind(bind_addr("s"));
    std::string ep = pull.get(zmq::sockopt::last_endpoint);
    zmq::socket_t push(ctx_a, zmq::socket_type::push);
    push.set(zmq::sockopt::sndhwm, 1000);
    push.connect(ep);
    push.send(zmq::buffer("w", 1), zmq::send_flags::none);  // warm the connection
    zmq::message_t m;
    (void)pull.recv(m);
    std::atomic<bool> done{false};
    std::thread rx([&] {
      zmq::message_t msg;
      for (long i = 0; i < n; ++i) (void)pull.recv(msg);
      done = true;
    });
    double rate = n / time_s([&] {
                    for (long i = 0; i < n; ++i) push.send(zmq::buffer(src.data(), size), zmq::send_flags::none);
                    while (!done) std::this_thread::yield();
                  });
    rx.join();
    push.set(zmq::sockopt::linger, 0);
    if (transport == "ipc") ::unlink(ep.substr(6).c_str());  // zmq leaves the socket file behind
    return rate;
  }
  double rtt_us(long n) {
    zmq::socket_t srv(far_ctx(), zmq::socket_type::pair);
    srv.bind(bind_addr("r"));
    std::string ep = srv.get(zmq::sockopt::last_endpoint);
    zmq::socket_t cli(ctx_a, zmq::socket_type::pair);
    cli.connect(ep);
    std::thread echo([&] {
      zmq::message_t msg;
      for (long i = 0; i < n + 1; ++i) {
        (void)srv.recv(msg);
        srv.send(msg, zmq::send_flags::none);
      }
    });
    std::string body(64 + kHeaderSize, 'r');  // the same bytes our envelope carries
    zmq::message_t reply;
    cli.send(zmq::buffer(body), zmq::send_flags::none);
    (void)cli.recv(reply);
    double us = 1e6 * time_s([&] {
                  for (long i = 0; i < n; ++i) {
                    cli.send(zmq::buffer(body), zmq::send_flags::none);
                    (void)cli.recv(reply);
                  }
                }) / n;
    echo.join();
    if (transport == "ipc") ::unlink(ep.substr(6).c_str());
    return us;
  }
};

// ---- Ray baseline: a child Python process answering "pipelined N" / "sync N" ----
struct RayServer {
  pid_t pid = -1;
  FILE* to = nullptr;
  FILE* from = nullptr;
  std::string why_not;
  bool failed = false;  // a repetition got no figure: the row would be wrong, so none is printed
  bool start() {
    std::string script = std::string(TROUPE_SOURCE_DIR) + "/launch/bench/runtime_ray.py";
    std::string py = troupe::python_executable();
    int in_pipe[2], out_pipe[2];
    if (::pipe(in_pipe) || ::pipe(out_pipe)) {
      why_not = "pipe() failed";
      return false;
    }
    const char* argv[] = {py.c_str(), script.c_str(), nullptr};
    int rc = spawn_piped(&pid, in_pipe, out_pipe, const_cast<char**>(argv), environ, false);
    if (rc != 0) {
      why_not = "cannot start " + py + ": " + std::strerror(rc);
      return false;
    }
    to = fdopen(in_pipe[1], "w");
    from = fdopen(out_pipe[0], "r");
    std::string line = read_line();
    if (line.rfind("ready", 0) != 0) {
      why_not = line.empty() ? "the Ray helper exited before it was ready (" + py + " " + script + ")" : line;
      stop();
      return false;
    }
    return true;
  }
  // Next protocol line ("ready", "calls_per_s X", "ERROR ..."); stray output is skipped.
  std::string read_line() {
    char buf[4096];
    while (from && std::fgets(buf, sizeof buf, from)) {
      std::string s(buf);
      while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
      if (s.rfind("ready", 0) == 0 || s.rfind("calls_per_s ", 0) == 0 || s.rfind("ERROR", 0) == 0) return s;
    }
    return "";
  }
  double run(const char* mode, long n) {
    std::fprintf(to, "%s %ld\n", mode, n);
    std::fflush(to);
    std::string line = read_line();
    double v = 0;
    if (std::sscanf(line.c_str(), "calls_per_s %lf", &v) != 1) {
      std::fprintf(stderr, "troupe bench runtime: the Ray helper stopped answering (%s)\n", line.c_str());
      failed = true;
    }
    return v;
  }
  void stop() {
    if (to) {
      std::fprintf(to, "quit\n");
      std::fclose(to);
      to = nullptr;
    }
    if (from) {
      std::fclose(from);
      from = nullptr;
    }
    if (pid > 0) {
      int status = 0;
      for (int i = 0; i < 100 && waitpid(pid, &status, WNOHANG) == 0; ++i) std::this_thread::sleep_for(100ms);
      if (waitpid(pid, &status, WNOHANG) == 0) {
        ::kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
      }
      pid = -1;
    }
  }
};

// The repetitions and message counts of the suite's rows.
struct RuntimeSizes {
  int reps;
  // The stream rows' repetitions are short (tens of ms) and loopback tcp's vary by +-20% from one
  // to the next on a 2-core VM: their medians take 9 at least, so one run's ratio is steady.
  int stream_reps;
  double scale;  // each repetition lasts tens of ms even in --quick
  long count(long full) const { return std::max(20L, static_cast<long>(full * scale)); }
};

const std::vector<std::pair<std::size_t, long>> kStreamSizes = {
    {64, 200000}, {1024, 100000}, {64 * 1024, 6000}, {1u << 20, 400}};

// rtt_64B_<transport>: round trips of 64 bytes against a raw ZeroMQ echo.
void rtt_row(const RuntimeSizes& z, const std::string& t, OurPair& ours, RawPair& raw) {
  // Remote: actor to actor, one thread per side like raw ZeroMQ's client and echo threads; the
  // round trip asked from outside any actor (a std::future handed to the asking thread, one
  // thread hop more) is the row's ask_get_us. inproc: asked from outside, since two actors of
  // one node may share one worker thread and then never cross threads at all.
  const bool remote = t != "inproc";
  long n = z.count(4000);
  Paired p = interleaved(z.reps, [&] { return remote ? ours.actor_rtt_us(n) : ours.ask_get_us(n); },
                         [&] { return raw.rtt_us(n); });
  nlohmann::json extra = {{"round_trips_per_rep", n}, {"ours_method", remote ? "actor_to_actor" : "ask_get"}};
  if (remote) {
    Paired ask = interleaved(z.reps, [&] { return ours.ask_get_us(n); }, [&] { return raw.rtt_us(n); });
    extra["ask_get_us"] = ask.ours;
    extra["ask_get_baseline_us"] = ask.baseline;
    extra["ask_get_ratio"] = ask.ours > 0 ? ask.baseline / ask.ours : 0.0;
  }
  emit(make_row(kSuite, "rtt_64B_" + t, {"round_trip_us", "us", Better::lower}, p, "raw_zmq", extra));
}

// The stream and round-trip rows of one transport; 1 if its actors could not be set up.
int transport_rows(const BenchOptions& opt, const RuntimeSizes& z, const std::string& t, const std::string& src) {
  bool want_any = false;
  for (auto& [s, n] : kStreamSizes) want_any |= opt.wants("stream_" + size_name(s) + "_" + t);
  want_any |= opt.wants("rtt_64B_" + t);
  if (!want_any) return 0;
  OurPair ours(t);
  if (!ours.ok) {
    std::fprintf(stderr, "troupe bench runtime: cannot set up %s actors: %s\n", t.c_str(), ours.error.c_str());
    return 1;
  }
  RawPair raw(t);
  for (auto& [size, full_n] : kStreamSizes) {
    std::string name = "stream_" + size_name(size) + "_" + t;
    if (!opt.wants(name)) continue;
    long n = z.count(full_n);
    Paired p = interleaved(z.stream_reps, [&] { return ours.stream(size, n, src); }, [&] { return raw.stream(size, n, src); });
    emit(make_row(kSuite, name, {"msgs_per_s", "msg/s", Better::higher}, p, "raw_zmq",
                  {{"bytes", size},
                   {"messages_per_rep", n},
                   {"ours_MBps", p.ours * size / 1e6},
                   {"baseline_MBps", p.baseline * size / 1e6}}));
  }
  if (opt.wants("rtt_64B_" + t)) rtt_row(z, t, ours, raw);
  return 0;
}

// calls_1KiB_pipelined / calls_1KiB_sync: calls to an actor on another node against a Ray actor.
void calls_rows(const BenchOptions& opt, const RuntimeSizes& z) {
  OurPair ours("ipc");  // an actor on another node, like a Ray actor in another process
  RayServer ray;
  bool have_ray = ray.start();
  if (!have_ray) std::fprintf(stderr, "troupe bench runtime: Ray baseline unavailable: %s\n", ray.why_not.c_str());
  for (bool pipelined : {true, false}) {
    std::string name = pipelined ? "calls_1KiB_pipelined" : "calls_1KiB_sync";
    if (!opt.wants(name) || !ours.ok) continue;
    long n = z.count(pipelined ? 20000 : 4000);
    long n_ray = std::max(20L, n / (pipelined ? 4 : 4));
    if (!have_ray) {
      skip_baseline(kSuite, name, "Ray is not importable by " + troupe::python_executable() + " (pip install ray): " + ray.why_not);
      continue;
    }
    Paired p = interleaved(z.reps, [&] { return ours.calls(n, pipelined); },
                           [&] { return ray.run(pipelined ? "pipelined" : "sync", n_ray); });
    if (ray.failed) {
      skip_baseline(kSuite, name, "the Ray helper failed during the measurement");
      break;
    }
    emit(make_row(kSuite, name, {"calls_per_s", "call/s", Better::higher}, p, "ray",
                  {{"transport", "ipc"}, {"calls_per_rep", n}, {"ray_calls_per_rep", n_ray}}));
  }
  ray.stop();
}

// codec_4KiB: encoding and decoding a 4 KiB trajectory frame against a memcpy of its bytes.
void codec_row(const RuntimeSizes& z) {
  TrajectoryMsg m;
  m.episode = 17;
  m.policy_version = 3;
  m.tokens.assign(500, 12345);
  m.logprobs.assign(500, -0.75f);
  m.reward = 1;
  EnvelopeHeader h;
  h.sender = {0, 1};
  h.recipient = {1, 2};
  std::size_t payload = payload_size_of(m);
  std::size_t frame_bytes = kHeaderSize + payload;
  std::string enc;  // reused, as a connection's buffer would be
  std::vector<char> copy_dst(frame_bytes), copy_src(frame_bytes, 'c');
  TrajectoryMsg out;
  long n = z.count(400000);
  volatile std::size_t sink = 0;
  auto ours_ns = [&] {
    return 1e9 * time_s([&] {
             for (long i = 0; i < n; ++i) {
               std::size_t sz = encode_frame_into(enc, m, h);
               auto r = decode_frame(enc.data(), sz, out);
               sink = sink + (r.ok() ? out.tokens.size() : 0);
             }
           }) / n;
  };
  auto memcpy_ns = [&] {
    return 1e9 * time_s([&] {
             for (long i = 0; i < n; ++i) {
               std::memcpy(copy_dst.data(), copy_src.data(), frame_bytes);
               copy_src[i % frame_bytes] = static_cast<char>(copy_dst[(i + 1) % frame_bytes]);  // keep the copy live
             }
           }) / n;
  };
  Paired p = interleaved(z.reps, ours_ns, memcpy_ns);
  emit(make_row(kSuite, "codec_4KiB", {"ns", "ns", Better::lower}, p, "memcpy",
                {{"frame_bytes", frame_bytes}, {"ops_per_rep", n}}));
}

}  // namespace

int run_runtime_suite(const BenchOptions& opt) {
  const int reps = std::max(opt.reps, 5);
  const RuntimeSizes z{reps, std::max(reps, 9), opt.quick ? 0.5 : 2.0};
  std::string src(1u << 20, 's');
  int failures = 0;
  for (const std::string t : {"inproc", "ipc", "tcp"}) failures += transport_rows(opt, z, t, src);
  if (opt.wants("calls_1KiB_pipelined") || opt.wants("calls_1KiB_sync")) calls_rows(opt, z);
  if (opt.wants("codec_4KiB")) codec_row(z);
  return failures ? 1 : 0;
}

}  // namespace troupe::bench
