// actors.relay*: weights down the relay tree (weight_sync.relay_fanout). The split covers every
// generator once; parts put back together give the message bit for bit; 7 generators with fan-out 2
// (inproc, and one ActorSystem per generator over ipc) hold learner 0's weights bit for bit after the
// full sync and the deltas, sync and async, with learner 0's rank sending 2 copies; a relay that dies
// as its part arrives is routed around (its children get the weights from its parent) and is
// marked down. Members that joined the job (nodes connected to node 0 only) relay like any
// generator, the addresses travelling with the parts; one that dies as a relay is routed around;
// members the job cannot reach stay leaves of the root. A delta streamed in as its payload
// arrives (sync mode's relays) ends bit for bit as the whole message applied, or as the base.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <set>

#include "tiny_config.test.h"
#include "troupe/actors/roles.h"
#include "troupe/actors/weight_codec.h"
#include "troupe/actors/weight_sync.h"
#include "troupe/actors/weight_relay.h"

using namespace troupe;
using namespace troupe::actors;
using runtime::ActorContext;
using runtime::ActorId;
using runtime::Task;

namespace {

constexpr int kGens = 7;

void collect(const std::vector<RelayTarget>& subtree, int fanout, std::multiset<int>& seen, int depth, int& deepest) {
  deepest = std::max(deepest, depth);
  for (const RelayChild& c : relay_children(subtree, fanout)) {
    EXPECT_LE(relay_children(subtree, fanout).size(), static_cast<size_t>(fanout));
    seen.insert(c.node.index);
    collect(c.below, fanout, seen, depth + 1, deepest);
  }
}

TEST(RelayTree, SplitCoversEveryGeneratorOnce) {
  for (int n : {1, 2, 7, 100, 1000})
    for (int f : {2, 4}) {
      std::vector<RelayTarget> all;
      for (int i = 0; i < n; ++i) all.push_back({ActorId{1, static_cast<uint32_t>(i + 1)}, i, {}, {}});
      std::multiset<int> seen;
      int deepest = 0;
      collect(all, f, seen, 1, deepest);
      EXPECT_EQ(seen.size(), static_cast<size_t>(n));
      EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), static_cast<size_t>(n));
      if (n == 1000 && f == 4) {
        EXPECT_LE(deepest, 6);
      }
    }
}

TEST(RelayTree, PartsPutBackTogetherBitForBit) {
  Weights w;
  w.version = 5;
  w.base_version = 4;
  w.encoding = 2;
  w.checksums = {1, 2, 3};
  w.probe_tokens = {1, 2};
  std::string payload(1000003, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 131 % 251);
  w.payload = runtime::Bytes(payload);
  for (size_t part : {size_t{1} << 20, size_t{4096}, size_t{2000000}}) {
    auto parts = weights_parts(w, part);
    EXPECT_EQ(parts.size(), (payload.size() + part - 1) / part);
    PartAssembly a;
    for (const auto& p : parts) EXPECT_TRUE(a.add(p));
    ASSERT_TRUE(a.complete());
    Weights back = a.take();
    EXPECT_EQ(back.payload.str(), payload);
    EXPECT_EQ(back.version, 5);
    EXPECT_EQ(back.base_version, 4);
    EXPECT_EQ(back.checksums, w.checksums);
    EXPECT_EQ(back.probe_tokens, w.probe_tokens);
  }
  auto parts = weights_parts(w, 4096);
  PartAssembly a;
  EXPECT_TRUE(a.add(parts[0]));
  EXPECT_FALSE(a.add(parts[2]));  // out of order
  EXPECT_FALSE(a.complete());
}

// A generator that dies as the first part of any version reaches it: its actor fails, and the
// request it was handling fails as peer_failed (as faults.generator_death_step does in one process;
// a rank that dies does the same through the runtime's node-down notice).
class DyingRelay : public runtime::Actor {
 public:
  DyingRelay() {
    handle<WeightsPart>([](runtime::Context& ctx, const WeightsPart&) -> Status {
      Error died = make_error(ErrorCode::peer_failed, "relay killed mid-transfer (test)");
      if (ctx.header() && (ctx.header()->flags & runtime::kFlagRequest)) (void)ctx.reply_error(died);
      ctx.fail(died);
      return {};
    });
  }
};

struct Outcome {
  std::vector<Result<WeightSyncReport>> reports;
  std::set<size_t> marked_down;
};

// Start sync, then `updates` times: train, sync. Async: each live generator answers a generation
// request after each sync, so its Acks are in before the next sync.
class Driver : public runtime::Actor {
 public:
  Driver(WeightSyncSection cfg, bool async, ActorId learner, std::vector<ActorId> gens, int updates,
         std::promise<Outcome>* done, std::set<int> members = {}, bool members_relay = false)
      : sync_(cfg, async), async_(async), learner_(learner), gens_(std::move(gens)), updates_(updates), done_(done),
        members_(std::move(members)), members_relay_(members_relay) {}
  void on_start(runtime::Context& ctx) override {
    ActorContext::Scope scope(here_, ctx);
    task_ = run();
    task_.start();
  }

 private:
  Task<Status> run() {
    Outcome out;
    peers_.learner = learner_;
    peers_.generators = gens_;
    peers_.alive = [this](size_t g) { return !down_.count(g); };
    peers_.mark_down = [this](size_t g) { down_.insert(g); };
    if (!members_.empty()) {
      auto member = [this](size_t g) { return members_.count(static_cast<int>(g)) > 0; };
      peers_.joined = member;
      if (!members_relay_) peers_.root_only = member;
    }
    for (int k = 0; k <= updates_; ++k) {
      if (k > 0) {
        auto trained = runtime::request<TrainRep>(here_, learner_, test_support::tiny_sft_batch(), std::chrono::seconds(60));
        if (auto t = co_await trained; !t.ok()) {
          out.reports.push_back(t.error());
          break;
        }
      }
      auto rep = co_await sync_.sync(here_, peers_);
      const bool ok = rep.ok();
      out.reports.push_back(std::move(rep));
      if (!ok) break;
      if (async_)
        for (size_t g = 0; g < gens_.size(); ++g) {
          if (down_.count(g)) continue;
          GenerateReq req;
          req.prompt_tokens = {{1, 10, 11}};
          req.sampling.max_new_tokens = 1;
          auto r = runtime::request<GenerateRep>(here_, gens_[g], req, std::chrono::seconds(60));
          (void)co_await r;
        }
    }
    out.marked_down = down_;
    here_->stop();
    done_->set_value(std::move(out));
    co_return Status{};
  }
  WeightSync sync_;
  bool async_;
  ActorId learner_;
  std::vector<ActorId> gens_;
  int updates_;
  std::promise<Outcome>* done_;
  std::set<int> members_;  // generators whose nodes know node 0 only (members that joined the job)
  bool members_relay_;     // false: the job cannot reach them (leaves of the root)
  WeightSyncPeers peers_;
  std::set<size_t> down_;
  ActorContext here_;
  Task<Status> task_;
};

struct TreeRun {
  Outcome out;
  std::shared_ptr<LearnerRole> learner;
  std::vector<std::shared_ptr<Generator>> gens;  // (null where a DyingRelay stood)
};

// Learner 0 and the driver on node 0; generator g on node g + 1 over ipc (ipc) or on node 0 (inproc).
// The nodes of `members` (ipc) are connected to node 0 only, as a member that joined a running job is.
TreeRun run_tree(const ExperimentConfig& cfg, bool async, bool ipc, int updates, int dying = -1,
                 const std::set<int>& members = {}, bool members_relay = false) {
  TreeRun run;
  EXPECT_TRUE(register_messages().ok());
  const std::string dir = "/tmp/troupe-relay-" + std::to_string(::getpid());
  std::vector<std::unique_ptr<runtime::ActorSystem>> nodes;
  std::vector<runtime::PeerInfo> table;
  for (int n = 0; n < (ipc ? kGens + 1 : 1); ++n) {
    runtime::SystemConfig sc;
    sc.threads = 2;
    sc.node_id = static_cast<uint32_t>(n);
    sc.role = "node" + std::to_string(n);
    if (ipc) sc.bind = "ipc://" + dir + "-" + std::to_string(n);
    auto sys = runtime::ActorSystem::create(sc);
    EXPECT_TRUE(sys.ok()) << sys.error().message;
    table.push_back({static_cast<uint32_t>(n), (*sys)->endpoint(), sc.role, ""});
    nodes.push_back(std::move(sys).value());
  }
  if (ipc) {
    std::vector<runtime::PeerInfo> job;  // every node but the members'
    for (size_t n = 0; n < table.size(); ++n)
      if (n == 0 || !members.count(static_cast<int>(n) - 1)) job.push_back(table[n]);
    for (size_t n = 0; n < nodes.size(); ++n) {
      const bool member = n > 0 && members.count(static_cast<int>(n) - 1);
      EXPECT_TRUE(nodes[n]->connect(n == 0 ? table : member ? std::vector<runtime::PeerInfo>{table[0]} : job).ok());
    }
  }
  auto l = LearnerRole::create(cfg, nullptr);
  EXPECT_TRUE(l.ok());
  run.learner = std::move(l).value();
  auto lp = run.learner;
  auto lid = nodes[0]->spawn([lp]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<LearnerActor>(lp, 1); });
  std::vector<ActorId> gids;
  for (int i = 0; i < kGens; ++i) {
    runtime::ActorSystem& host = *nodes[ipc ? i + 1 : 0];
    Result<ActorId> id = make_error(ErrorCode::internal, "");
    if (i == dying) {
      run.gens.push_back(nullptr);
      id = host.spawn([]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<DyingRelay>(); });
    } else {
      auto g = Generator::create(cfg);
      EXPECT_TRUE(g.ok());
      std::shared_ptr<Generator> gp = std::move(g).value();
      run.gens.push_back(gp);
      id = host.spawn([gp, i]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<GeneratorActor>(gp, 1, 0, i); });
    }
    EXPECT_TRUE(id.ok());
    gids.push_back(*id);
  }
  std::promise<Outcome> done;
  auto fut = done.get_future();
  auto ws = cfg.weight_sync;
  EXPECT_TRUE(nodes[0]->spawn([&, ws, gids]() -> std::unique_ptr<runtime::Actor> {
    return std::make_unique<Driver>(ws, async, *lid, gids, updates, &done, members, members_relay);
  }).ok());
  run.out = fut.get();
  for (auto& n : nodes) n->shutdown();
  return run;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_everyone_holds_learner0(const TreeRun& run, const ExperimentConfig& cfg) {
  std::vector<float> master = run.learner->weights().params;
  round_to_dtype(master, cfg.weight_sync.dtype);
  for (size_t g = 0; g < run.gens.size(); ++g) {
    if (!run.gens[g]) continue;
    EXPECT_EQ(run.gens[g]->version(), run.learner->version()) << "generator " << g;
    EXPECT_TRUE(same_bits(run.gens[g]->model().params(), master)) << "generator " << g;
  }
}

ExperimentConfig tree_config(const char* dtype) {
  ExperimentConfig c = test_support::tiny_config();
  c.optimizer.lr = 0.01f;
  c.weight_sync.relay_fanout = 2;
  c.weight_sync.dtype = *enum_from_name<WeightDtype>(dtype);
  return c;
}

void check_tree(bool async, bool ipc) {
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(std::string(dtype) + (async ? " async" : " sync") + (ipc ? " ipc" : " inproc"));
    ExperimentConfig cfg = tree_config(dtype);
    TreeRun run = run_tree(cfg, async, ipc, 3);
    ASSERT_EQ(run.out.reports.size(), 4u);
    for (size_t k = 0; k < run.out.reports.size(); ++k) {
      ASSERT_TRUE(run.out.reports[k].ok()) << run.out.reports[k].error().message;
      const WeightSyncReport& r = *run.out.reports[k];
      const std::uint64_t one = k == 0 ? r.full_bytes : r.delta_bytes;
      EXPECT_EQ(r.full + r.delta, kGens);
      EXPECT_EQ(r.bytes_sent, 2 * one) << "learner 0's rank sends one copy per child of the root";
      if (!async) {
        EXPECT_EQ(r.relayed_bytes, (kGens - 2) * one) << "the generators pass on the rest";
      }
    }
    EXPECT_GT(run.out.reports[1]->delta, 0);
    EXPECT_TRUE(run.out.marked_down.empty());
    expect_everyone_holds_learner0(run, cfg);
  }
}

}  // namespace

// A delta applied while its payload arrives (StreamedDelta, as a relay's parts come) ends as
// apply_weights on the whole message: the same values bit for bit and the same status; a failed
// checksum, a corrupt chunk or an abort half-way leave the base version bit for bit.
static WeightsApplied streamed(const Weights& w, std::vector<float>& values, const std::vector<policy::TensorSpec>& tensors,
                        WeightDtype dtype, size_t abort_at = std::string::npos) {
  Weights head = w;
  head.payload = runtime::Bytes();
  StreamedDelta s(head, values, tensors, dtype);
  EXPECT_TRUE(s.started());
  for (size_t at = 4096; at < w.payload.size(); at += 4096) {
    s.feed(w.payload.data(), at);
    if (at >= abort_at) {
      s.abort(w.payload.data());
      return WeightsApplied{WeightsStatus::refused, "aborted"};
    }
  }
  return s.finish(w);
}

TEST(RelayTree, StreamedDeltaIsApplyWeightsBitForBit) {
  const size_t n0 = 300007, n1 = 200003, n2 = 5, n = n0 + n1 + n2;
  const std::vector<policy::TensorSpec> tensors = {{"a.weight", {static_cast<int64_t>(n0)}, 0},
                                                   {"b.weight", {static_cast<int64_t>(n1)}, n0},
                                                   {"c.weight", {static_cast<int64_t>(n2)}, n0 + n1}};
  for (WeightDtype dtype : {WeightDtype::fp32, WeightDtype::bf16}) {
    SCOPED_TRACE(enum_string(dtype));
    std::mt19937_64 rng(7);
    std::normal_distribution<float> d(0.0f, 0.02f);
    std::vector<float> master(n);
    for (float& x : master) x = d(rng);
    WeightEncoder enc(dtype, tensors);
    Weights full, delta;
    enc.encode(master, 0, true, full);
    std::vector<float> base(n, 0.0f);
    ASSERT_EQ(apply_weights(full, base, tensors, dtype).status, WeightsStatus::applied);
    for (float& x : master) x += (rng() & 1) ? 1e-3f : -1e-3f;
    enc.encode(master, 1, true, delta);
    ASSERT_EQ(delta.encoding, static_cast<std::int32_t>(WeightEncoding::delta));
    ASSERT_GT(delta.payload.size(), 3 * 4096u);
    std::vector<float> whole = base, mine = base;
    ASSERT_EQ(apply_weights(delta, whole, tensors, dtype).status, WeightsStatus::applied);
    ASSERT_EQ(streamed(delta, mine, tensors, dtype).status, WeightsStatus::applied);
    EXPECT_TRUE(same_bits(mine, whole));
    Weights wrong_sum = delta;
    wrong_sum.checksums.front() ^= 1;
    std::string bytes = delta.payload.str();
    bytes[bytes.size() / 3] = static_cast<char>(bytes[bytes.size() / 3] ^ 0x5a);
    Weights torn = delta;
    torn.payload = runtime::Bytes(bytes);
    for (const Weights* bad : {&wrong_sum, &torn}) {
      std::vector<float> ref = base;
      mine = base;
      const WeightsApplied r = streamed(*bad, mine, tensors, dtype);
      EXPECT_EQ(r.status, apply_weights(*bad, ref, tensors, dtype).status);
      EXPECT_NE(r.status, WeightsStatus::applied);
      EXPECT_TRUE(same_bits(mine, base)) << r.detail;
    }
    mine = base;
    streamed(delta, mine, tensors, dtype, delta.payload.size() / 2);
    EXPECT_TRUE(same_bits(mine, base)) << "aborted half-way";
  }
}

TEST(RelayTree, SevenGeneratorsInprocGetLearner0sWeights) {
  check_tree(false, false);
  check_tree(true, false);
}

TEST(RelayTree, SevenGeneratorsOverIpcGetLearner0sWeights) { check_tree(false, true); }

TEST(RelayTree, SevenGeneratorsStreamDeltasOfManyParts) {
  // a vocabulary of 16384: deltas of several parts, which sync mode's generators apply as they come
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    ExperimentConfig cfg = tree_config(dtype);
    cfg.policy.model.vocab_size = 16384;
    TreeRun run = run_tree(cfg, false, false, 2);
    ASSERT_EQ(run.out.reports.size(), 3u);
    for (const auto& r : run.out.reports) ASSERT_TRUE(r.ok()) << r.error().message;
    for (size_t k = 1; k < run.out.reports.size(); ++k) {
      EXPECT_EQ(run.out.reports[k]->delta, kGens);
      EXPECT_GT(run.out.reports[k]->delta_bytes, 2 * kRelayPartBytes);
      EXPECT_EQ(run.out.reports[k]->resent, 0);
    }
    expect_everyone_holds_learner0(run, cfg);
  }
}

TEST(RelayTree, RelayKilledMidTransferIsRoutedAround) {
  for (bool ipc : {false, true}) {
    SCOPED_TRACE(ipc ? "ipc" : "inproc");
    ExperimentConfig cfg = tree_config("bf16");
    // generator 0 is the root's first child, relaying to a subtree of 3
    TreeRun run = run_tree(cfg, false, ipc, 2, /*dying=*/0);
    ASSERT_EQ(run.out.reports.size(), 3u);
    for (const auto& r : run.out.reports) ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(run.out.marked_down, std::set<size_t>{0});
    expect_everyone_holds_learner0(run, cfg);
    EXPECT_EQ(run.out.reports[1]->full + run.out.reports[1]->delta, kGens - 1);  // the dead one is skipped after
  }
}

TEST(RelayTree, MembersThatReachTheRootOnlyAreItsLeaves) {
  // generators 1 and 4 joined the job: connected to node 0 only, so they neither relay nor get
  // their weights from a relay; the other five form the tree of fan-out 2 under the root
  ExperimentConfig cfg = tree_config("bf16");
  TreeRun run = run_tree(cfg, false, true, 2, -1, {1, 4});
  ASSERT_EQ(run.out.reports.size(), 3u);
  for (size_t k = 0; k < run.out.reports.size(); ++k) {
    ASSERT_TRUE(run.out.reports[k].ok()) << run.out.reports[k].error().message;
    const WeightSyncReport& r = *run.out.reports[k];
    const std::uint64_t one = k == 0 ? r.full_bytes : r.delta_bytes;
    EXPECT_EQ(r.full + r.delta, kGens);
    EXPECT_EQ(r.resent, 0) << "no hop failed";
    EXPECT_EQ(r.bytes_sent, 4 * one) << "the root sends to its 2 relays and to the 2 members";
    EXPECT_EQ(r.relayed_bytes, 3 * one) << "the relays pass it on to the other 3 of the tree";
  }
  EXPECT_TRUE(run.out.marked_down.empty());
  expect_everyone_holds_learner0(run, cfg);
}

TEST(RelayTree, MembersThatJoinedRelayLikeAnyGenerator) {
  // generators 1 and 4 joined the job: their nodes know node 0 only, and the job's nodes do not
  // know theirs. In the tree of fan-out 2, member 1 is generator 0's child and relays to generator
  // 2, member 4 is the root's child and relays to 5 and 6: the addresses travel with the parts.
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    ExperimentConfig cfg = tree_config("bf16");
    TreeRun run = run_tree(cfg, async, true, 2, -1, {1, 4}, /*members_relay=*/true);
    ASSERT_EQ(run.out.reports.size(), 3u);
    for (size_t k = 0; k < run.out.reports.size(); ++k) {
      ASSERT_TRUE(run.out.reports[k].ok()) << run.out.reports[k].error().message;
      const WeightSyncReport& r = *run.out.reports[k];
      const std::uint64_t one = k == 0 ? r.full_bytes : r.delta_bytes;
      EXPECT_EQ(r.full + r.delta, kGens);
      EXPECT_EQ(r.resent, 0) << "no hop failed";
      EXPECT_EQ(r.bytes_sent, 2 * one) << "the root sends to its 2 children only";
      if (!async) {
        EXPECT_EQ(r.relayed_bytes, (kGens - 2) * one) << "members relay too";
      }
    }
    EXPECT_TRUE(run.out.marked_down.empty());
    expect_everyone_holds_learner0(run, cfg);
  }
}

TEST(RelayTree, MemberRelayKilledIsRoutedAround) {
  // member 0 (node connected to node 0 only) is the root's first child, relaying to a subtree of 3,
  // and dies as the weights reach it: its children (member 4's subtree aside) get them from the root
  ExperimentConfig cfg = tree_config("bf16");
  TreeRun run = run_tree(cfg, false, true, 2, /*dying=*/0, {0, 4}, /*members_relay=*/true);
  ASSERT_EQ(run.out.reports.size(), 3u);
  for (const auto& r : run.out.reports) ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(run.out.marked_down, std::set<size_t>{0});
  expect_everyone_holds_learner0(run, cfg);
  EXPECT_EQ(run.out.reports[1]->full + run.out.reports[1]->delta, kGens - 1);
}
