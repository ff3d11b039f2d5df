// troupe_weight_sync_bench: the helper `troupe bench weight_sync` starts under
// `mpirun -np 4 --mca btl self,tcp`: rank 0 hosts learner 0 (and drives), ranks 1-3 one generator
// each, connected by troupe's runtime over ZeroMQ tcp as in `troupe run`. Per repetition learner 0
// takes one AdamW step (lr 1e-6), then the weights go to 1 and to 3 generators through the real
// path (actors::WeightSync: GetWeightsReq -> Weights -> every generator's set_weights -> Ack) as
// a delta and in full; the baseline is a raw MPI_Bcast of the generators' full buffer (their dtype)
// among the same ranks. Ours and the baseline alternate; while rank 0 syncs, the other ranks'
// main threads wait on a gate message (not in an MPI call, whose polling would take the cores the
// generators decode on). Rank 0 prints one JSON line per case: {"weight_sync_case": ..., medians}.
// The suite times the sync with weight_sync.probe off (the transfer, decode and checksums alone);
// --probe turns it on (learner 0 and every generator then also run the probe's forward pass).
// bf16 deltas are prepared in the optimizer step (weight_sync.prepare_in_step); --no-prepare
// leaves it all to the sync. Each row also gives the step's median seconds (step_s) and the share
// of delta syncs that took a prepared delta (prepared).
// --relay F (under mpirun -np 8: 7 generators): the relay rows instead. Per repetition one AdamW
// step, then a delta sync with weight_sync.relay_fanout 0 (the star: every generator from rank 0)
// and, after another step, one with fan-out F (the relay tree); each prints rank 0's egress bytes
// (WeightSyncReport::bytes_sent) and seconds. --gbps G limits every rank's link to G Gbit/s each
// way (TROUPE_BENCH_LINK_BYTES_PER_S, which the runtime's transport reads for benchmarks only).
//   troupe_weight_sync_bench --dtype bf16|fp32 --reps N [--quick] [--probe] [--no-prepare] [--lora RANK]
//                            [--relay F [--gbps G]]
#include <mpi.h>
#include <omp.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/bench/bench.h"
#include "smollm2_shape.h"
#include "troupe/actors/messages.h"
#include "troupe/actors/roles.h"
#include "troupe/actors/weight_codec.h"
#include "troupe/actors/weight_sync.h"
#include "troupe/runtime/cluster.h"

namespace {

using namespace troupe;
using actors::ExperimentConfig;
using runtime::ActorContext;
using runtime::ActorId;
using runtime::Task;

constexpr int kGenerators = 3;
constexpr int kRelayGenerators = 7;  // --relay

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "troupe_weight_sync_bench: %s\n", what.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

// SmolLM2-135M's shape (Llama layout, tied embeddings), random init; --quick: 6 layers, vocab 16384.
ExperimentConfig bench_config(const std::string& dtype, bool quick, bool probe, bool prepare, int lora_rank) {
  ExperimentConfig c;
  auto& m = c.policy.model;
  m = bench::smollm2_135m_architecture();
  if (quick) {
    m.vocab_size = 16384;
    m.num_hidden_layers = 6;
  }
  c.policy.tokenizer = actors::TokenizerKind::byte_level;
  c.optimizer.lr = 1e-6f;  // AdamW (constant schedule, no warm-up)
  c.weight_sync.dtype = enum_from_name<actors::WeightDtype>(dtype).value_or(actors::WeightDtype::fp32);
  c.weight_sync.full_every = 0;  // every sync of the delta cases is a delta
  c.weight_sync.probe = probe;   // off: the transfer alone (the probe is a forward on each side)
  c.weight_sync.prepare_in_step = prepare;
  c.policy.lora.rank = lora_rank;  // > 0: adapters on every linear layer, so only they are synced
  c.policy.lora.alpha = static_cast<float>(lora_rank);
  return c;
}

// One SFT step's batch: a few short sequences (the step only has to move every weight a little).
actors::TrainReq one_step_batch() {
  actors::TrainReq req;
  req.phase = learner::Phase::sft;
  for (int i = 0; i < 2; ++i) {
    actors::TrainSample s;
    s.prompt = {1, 40 + i, 41, 42, 43};
    s.completion = {44, 45 + i, 46, 2};
    req.samples.push_back(s);
  }
  return req;
}

// Rank 0 -> the other ranks: "phase `phase` of the baseline may start".
struct GateOpen {
  static constexpr std::uint32_t type_id = message_id::bench_gate_open;
  static constexpr const char* type_name = "bench.GateOpen";
  std::int32_t phase = 0;
  template <class A>
  void serialize(A& ar) { ar(phase); }
};
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  int opened = -1;
  void wait_for(int phase) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return opened >= phase; });
  }
};
class GateActor : public runtime::Actor {
 public:
  explicit GateActor(Gate* g) {
    handle<GateOpen>([g](runtime::Context&, const GateOpen& m) {
      {
        std::lock_guard lk(g->mu);
        g->opened = std::max(g->opened, m.phase);
      }
      g->cv.notify_all();
    });
  }
};

// Runs one coroutine job on an actor of its own and waits for it (from the main thread).
class JobActor : public runtime::Actor {
 public:
  using Job = std::function<Task<Status>(ActorContext&)>;
  JobActor(Job job, std::promise<Status>* done) : job_(std::move(job)), done_(done) {}
  void on_start(runtime::Context& ctx) override {
    ActorContext::Scope scope(here_, ctx);
    task_ = drive();
    task_.start();
  }

 private:
  Task<Status> drive() {
    Status st = co_await job_(here_);
    here_->stop();
    done_->set_value(st);
    co_return Status{};
  }
  Job job_;
  std::promise<Status>* done_;
  ActorContext here_;
  Task<Status> task_;
};

Status run_job(runtime::ActorSystem& sys, JobActor::Job job) {
  std::promise<Status> done;
  auto result = done.get_future();
  auto id = sys.spawn([&]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<JobActor>(job, &done); });
  if (!id.ok()) return id.error();
  return result.get();
}

Task<Status> train_once(ActorContext& here, ActorId learner, const actors::TrainReq& req) {
  auto rep = runtime::request<actors::TrainRep>(here, learner, req, std::chrono::hours(1));
  TROUPE_CO_ASSIGN_OR_RETURN(auto r, co_await rep);
  (void)r;
  co_return Status{};
}

Task<Status> sync_once(ActorContext& here, actors::WeightSync& ws, const actors::WeightSyncPeers& peers,
                       actors::WeightSyncReport* out) {
  TROUPE_CO_ASSIGN_OR_RETURN(*out, co_await ws.sync(here, peers));
  co_return Status{};
}

// MPI_Bcast of `bytes` from rank 0 among `comm`, between barriers; the slowest rank's seconds (on rank 0).
double timed_bcast(MPI_Comm comm, std::vector<char>& buf) {
  MPI_Barrier(comm);
  const double t0 = MPI_Wtime();
  for (size_t at = 0; at < buf.size(); at += INT_MAX / 2) {
    const int n = static_cast<int>(std::min<size_t>(INT_MAX / 2, buf.size() - at));
    MPI_Bcast(buf.data() + at, n, MPI_BYTE, 0, comm);
  }
  double dt = MPI_Wtime() - t0, slowest = 0;
  MPI_Reduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, comm);
  return slowest;
}

struct HelperArgs {
  std::string dtype = "bf16";
  int reps = 5;
  bool quick = false, probe = false, prepare = true;
  int lora = 0;  // LoRA rank (0 = full weights)
  int relay = 0;      // --relay F: the relay rows with fan-out F (7 generators)
  double gbps = 0;    // --gbps G: every rank's link limited to G Gbit/s each way
};

HelperArgs parse_args(int argc, char** argv) {
  HelperArgs a;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc) a.dtype = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) a.reps = std::max(5, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--quick")) a.quick = true;
    else if (!std::strcmp(argv[i], "--probe")) a.probe = true;
    else if (!std::strcmp(argv[i], "--no-prepare")) a.prepare = false;
    else if (!std::strcmp(argv[i], "--lora") && i + 1 < argc) a.lora = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--relay") && i + 1 < argc) a.relay = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--gbps") && i + 1 < argc) a.gbps = std::atof(argv[++i]);
  }
  return a;
}

// What every rank of the helper holds: its role (learner 0 on rank 0, else a generator), the
// gate, the baseline's buffer, and the phase counter both sides step in lockstep.
struct HelperRank {
  HelperArgs args;
  int rank = 0, world = 1, threads = 1;
  ExperimentConfig cfg;
  runtime::ActorSystem* sys = nullptr;
  std::shared_ptr<actors::LearnerRole> learner;  // rank 0
  size_t elements = 0;                           // parameters of this rank's model
  Gate gate;
  std::vector<char> buf;  // the baseline's buffer: the generators' weights in their dtype
  int phase = 0;
};

runtime::ClusterConfig helper_cluster(int gens, double gbps) {
  runtime::ClusterConfig cc;
  cc.transport = runtime::TransportKind::tcp;
  cc.roles = {"learner0"};
  for (int g = 0; g < gens; ++g) cc.roles.push_back("generator" + std::to_string(g));
  // the runtime's transport paces every rank's link (a benchmark-only setting of the environment)
  if (gbps > 0) setenv("TROUPE_BENCH_LINK_BYTES_PER_S", std::to_string(gbps * 1e9 / 8).c_str(), 1);
  cc.mpi_thread_multiple = true;
  cc.system.threads = 2;
  cc.system.heartbeat.timeout = std::chrono::minutes(10);  // a rank encoding 540 MB is busy, not dead
  return cc;
}

// Spawns this rank's role ("learner0" or "generatorN") and its gate; sets b.learner and b.elements.
void spawn_rank_actors(HelperRank& b) {
  const int threads = b.threads;
  runtime::SpawnOptions so;
  Result<ActorId> id = ActorId{};
  if (b.rank == 0) {
    auto l = actors::LearnerRole::create(b.cfg, nullptr);
    if (!l.ok()) die(l.error().message);
    b.learner = std::move(l).value();
    auto lp = b.learner;
    so.name = "learner0";
    id = b.sys->spawn([lp, threads]() -> std::unique_ptr<runtime::Actor> {
      return std::make_unique<actors::LearnerActor>(lp, threads);
    }, so);
    b.elements = b.learner->weights().params.size();
  } else {
    auto g = actors::Generator::create(b.cfg);
    if (!g.ok()) die(g.error().message);
    std::shared_ptr<actors::Generator> gp = std::move(g).value();
    b.elements = gp->model().params().size();
    so.name = "generator" + std::to_string(b.rank - 1);
    const int index = b.rank - 1;
    id = b.sys->spawn([gp, threads, index]() -> std::unique_ptr<runtime::Actor> {
      return std::make_unique<actors::GeneratorActor>(gp, threads, 0, index);
    }, so);
  }
  if (!id.ok()) die(id.error().message);
  so.name = "gate";
  Gate* gate = &b.gate;
  if (auto g = b.sys->spawn([gate]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<GateActor>(gate); }, so);
      !g.ok())
    die(g.error().message);
}

// The baseline's buffer, on rank 0 filled with learner 0's weights in the generators' dtype (the
// bytes themselves do not change what MPI_Bcast costs; the weights' own are used).
void fill_baseline_buffer(HelperRank& b) {
  const size_t width = b.args.dtype == "bf16" ? 2 : 4;
  b.buf.assign(b.elements * width, 1);
  if (b.rank != 0) return;
  auto p = b.learner->weights().params;
  for (size_t i = 0; i < b.elements; ++i) {
    uint32_t v;
    std::memcpy(&v, &p[i], 4);
    if (width == 2) v >>= 16;
    std::memcpy(b.buf.data() + i * width, &v, width);
  }
}

// Rank 0's samples of one generator count, per repetition.
struct SyncSamples {
  std::vector<double> delta_s, full_s, bcast_s, changed_frac, step_s;
  std::vector<double> delta_bytes, full_bytes;
  int64_t prepared = 0;  // delta syncs that took a delta prepared in the step
};

// Prints the delta and full rows of `gens` generators (rank 0).
void print_rows(const HelperRank& b, int gens, const SyncSamples& s) {
  const double buffer_bytes = static_cast<double>(b.buf.size());
  for (const char* kind : {"delta", "full"}) {
    const bool is_delta = std::string(kind) == "delta";
    nlohmann::json row = {{"weight_sync_case", std::string(kind) + "_" + std::to_string(gens) + "gen"},
                          {"ours", bench::median(is_delta ? s.delta_s : s.full_s)},
                          {"baseline", bench::median(s.bcast_s)},
                          {"bytes_sent", bench::median(is_delta ? s.delta_bytes : s.full_bytes)},
                          {"baseline_bytes", buffer_bytes * gens},
                          {"changed_frac", bench::median(s.changed_frac)},
                          {"step_s", bench::median(s.step_s)},
                          {"prepared", static_cast<double>(s.prepared) / b.args.reps},
                          {"generators", gens},
                          {"params", b.elements},
                          {"dtype", b.args.dtype},
                          {"probe", b.args.probe},
                          {"reps", b.args.reps},
                          {"threads_per_rank", b.threads}};
    std::printf("%s\n", row.dump().c_str());
    std::fflush(stdout);
  }
}

// Rank 0 with `gens` generators: per repetition one AdamW step, then a delta and a full sync
// (ours) and the gated MPI_Bcast (baseline), alternating which goes first.
void time_syncs(HelperRank& b, int gens, MPI_Comm comm) {
  auto& sys = *b.sys;
  const ActorId learner_id = runtime::ActorSystem::named(0, "learner0");
  actors::WeightSyncPeers peers;
  peers.learner = learner_id;
  for (int g = 0; g < gens; ++g)
    peers.generators.push_back(runtime::ActorSystem::named(static_cast<uint32_t>(g + 1), "generator" + std::to_string(g)));
  actors::WeightSyncSection delta_cfg = b.cfg.weight_sync, full_cfg = b.cfg.weight_sync;
  full_cfg.mode = actors::WeightSyncMode::full;
  actors::WeightSync delta_sync(delta_cfg, false), full_sync(full_cfg, false);
  actors::WeightSyncReport rep;
  auto sync = [&](actors::WeightSync& ws) {
    Status st = run_job(sys, [&](ActorContext& h) { return sync_once(h, ws, peers, &rep); });
    if (!st.ok()) die("weight sync: " + st.error().message);
    return rep;
  };
  const auto batch = one_step_batch();
  auto train = [&] {
    Status st = run_job(sys, [&](ActorContext& h) { return train_once(h, learner_id, batch); });
    if (!st.ok()) die("train step: " + st.error().message);
  };
  // warm-up (untimed): the first sync of each is full, and a delta needs a base
  sync(delta_sync);
  sync(full_sync);
  SyncSamples s;
  const int64_t prepared_before = b.learner->prepared_deltas();
  for (int r = 0; r < b.args.reps; ++r, ++b.phase) {
    s.step_s.push_back(bench::time_s(train));  // one AdamW step at lr 1e-6: the update every delta carries
    auto ours = [&] {
      auto d = sync(delta_sync);
      if (d.delta != gens || d.full != 0) die("expected a delta to every generator");
      s.delta_s.push_back(d.seconds);
      s.delta_bytes.push_back(static_cast<double>(d.bytes_sent));
      s.changed_frac.push_back(static_cast<double>(d.changed) / static_cast<double>(d.elements));
      auto f = sync(full_sync);
      s.full_s.push_back(f.seconds);
      s.full_bytes.push_back(static_cast<double>(f.bytes_sent));
    };
    auto baseline = [&] {
      for (int q = 1; q < b.world; ++q)
        (void)sys.send(runtime::ActorSystem::named(static_cast<uint32_t>(q), "gate"), GateOpen{b.phase});
      s.bcast_s.push_back(timed_bcast(comm, b.buf));
    };
    if (r % 2 == 0) {  // alternate which goes first
      ours();
      baseline();
    } else {
      baseline();
      ours();
    }
  }
  s.prepared = b.learner->prepared_deltas() - prepared_before;
  print_rows(b, gens, s);
}


// --relay: rank 0 times `reps` delta syncs to the 7 generators with the star, then with the relay
// tree (each WeightSync starts with an untimed full sync), one AdamW step before each sync.
void time_relay(HelperRank& b, int gens) {
  auto& sys = *b.sys;
  const ActorId learner_id = runtime::ActorSystem::named(0, "learner0");
  actors::WeightSyncPeers peers;
  peers.learner = learner_id;
  for (int g = 0; g < gens; ++g)
    peers.generators.push_back(runtime::ActorSystem::named(static_cast<uint32_t>(g + 1), "generator" + std::to_string(g)));
  const auto batch = one_step_batch();
  nlohmann::json sides;
  for (int fanout : {0, b.args.relay}) {
    actors::WeightSyncSection cfg = b.cfg.weight_sync;
    cfg.relay_fanout = fanout;
    actors::WeightSync ws(cfg, false);
    actors::WeightSyncReport rep;
    auto sync = [&] {
      Status st = run_job(sys, [&](ActorContext& h) { return sync_once(h, ws, peers, &rep); });
      if (!st.ok()) die("weight sync: " + st.error().message);
      return rep;
    };
    sync();  // warm-up: the first sync is full
    std::vector<double> secs, bytes, relayed, changed;
    for (int r = 0; r < b.args.reps; ++r) {
      Status st = run_job(sys, [&](ActorContext& h) { return train_once(h, learner_id, batch); });
      if (!st.ok()) die("train step: " + st.error().message);
      auto d = sync();
      if (d.delta != gens || d.full != 0) die("expected a delta to every generator");
      secs.push_back(d.seconds);
      bytes.push_back(static_cast<double>(d.bytes_sent));
      relayed.push_back(static_cast<double>(d.relayed_bytes));
      changed.push_back(static_cast<double>(d.delta_bytes));
    }
    sides[fanout == 0 ? "star" : "tree"] = {{"seconds", bench::median(secs)},
                                            {"egress_bytes", bench::median(bytes)},
                                            {"relayed_bytes", bench::median(relayed)},
                                            {"delta_bytes", bench::median(changed)}};
  }
  nlohmann::json row = {{"weight_sync_case", "relay"},
                        {"star", sides["star"]},
                        {"tree", sides["tree"]},
                        {"fanout", b.args.relay},
                        {"gbps", b.args.gbps},
                        {"generators", gens},
                        {"params", b.elements},
                        {"dtype", b.args.dtype},
                        {"reps", b.args.reps},
                        {"threads_per_rank", b.threads}};
  std::printf("%s\n", row.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  HelperRank b;
  b.args = parse_args(argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.world);
  const int gens = b.args.relay > 0 ? kRelayGenerators : kGenerators;
  if (b.world != 1 + gens) die("run under mpirun -np " + std::to_string(1 + gens));
  // Every rank computes with all cores: the phases take turns (learner 0 encodes while the
  // generators wait, then they decode), so no core is left idle by a share that assumes they overlap.
  b.threads = omp_get_num_procs();
  omp_set_num_threads(b.threads);

  b.cfg = bench_config(b.args.dtype, b.args.quick, b.args.probe, b.args.prepare, b.args.lora);
  auto cluster_r = runtime::Cluster::bootstrap(helper_cluster(gens, b.args.gbps));
  if (!cluster_r.ok()) die(cluster_r.error().message);
  auto& cluster = **cluster_r;
  b.sys = &cluster.system();
  spawn_rank_actors(b);
  cluster.barrier();
  if (b.args.relay > 0) {  // the generator ranks answer rank 0's syncs until it is done
    if (b.rank == 0) {
      time_relay(b, gens);
      for (int q = 1; q < b.world; ++q) (void)b.sys->send(runtime::ActorSystem::named(static_cast<uint32_t>(q), "gate"), GateOpen{0});
    } else {
      b.gate.wait_for(0);  // (not in an MPI call, whose polling would take the cores the generators decode on)
    }
    MPI_Barrier(MPI_COMM_WORLD);
    cluster.request_shutdown("bench done");
    cluster.finish();
    return 0;
  }
  fill_baseline_buffer(b);
  MPI_Comm comm1 = MPI_COMM_NULL;  // ranks 0 and 1: learner 0 and one generator
  MPI_Comm_split(MPI_COMM_WORLD, b.rank <= 1 ? 0 : MPI_UNDEFINED, b.rank, &comm1);

  for (int gens : {1, kGenerators}) {
    MPI_Comm comm = gens == 1 ? comm1 : MPI_COMM_WORLD;
    if (b.rank == 0) {
      time_syncs(b, gens, comm);
      continue;
    }
    // the generator ranks: each baseline when rank 0 opens its gate
    for (int r = 0; r < b.args.reps; ++r, ++b.phase) {
      b.gate.wait_for(b.phase);
      if (b.rank <= gens) timed_bcast(comm, b.buf);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm1 != MPI_COMM_NULL) MPI_Comm_free(&comm1);
  cluster.request_shutdown("bench done");
  cluster.finish();
  return 0;
}
