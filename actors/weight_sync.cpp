// Weight sync: learner 0's weights, tagged with their version (and a delta's base version), to
// every generator as Weights messages, never through files; every generator acknowledges each
// one (troupe/actors/weight_sync.h says when a generator gets the full weights). Sync mode awaits
// the Acks (the next step samples with the new weights); async mode sends and goes on (the
// generators take the weights after the request they are sampling), and each Ack updates, on
// arrival, what its generator is known to hold.
#include "troupe/actors/weight_sync.h"

#include <chrono>

#include "coordinator_internal.h"
#include "troupe/actors/messages.h"
#include "troupe/actors/weight_codec.h"
#include "troupe/actors/weight_group.h"

namespace troupe::actors {

using runtime::ActorContext;
using runtime::ActorId;
using runtime::Reply;
using runtime::request;
using runtime::Task;

namespace {

constexpr auto kSyncTimeout = std::chrono::hours(2);

double steady_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string generator_name(const WeightSyncPeers& p, size_t g) {
  return "generator " + std::to_string(g) + " (node " + std::to_string(p.generators[g].node) + ")";
}

std::uint64_t wire_bytes(const Weights& w) { return w.payload.size() + w.params.size() * sizeof(float); }

}  // namespace

struct WeightSync::State {
  WeightSyncSection cfg;
  bool async = false;
  std::vector<std::int64_t> held;      // per generator: the version its last Ack confirmed (-1: none)
  std::vector<std::int64_t> expected;  // what it holds once it handled what it was sent (-1: unknown: full next)
  std::vector<std::int64_t> sent;      // the version it was sent last (-1: none)
  std::int64_t published = -1;         // the version learner 0 encoded last
  std::optional<Error> async_failure;  // an async Ack's probe mismatch, returned by the next sync
  int group = 0;  // weight_sync.transport nccl: 0 not formed yet, 1 formed (broadcasts), -1 left (a member died)
  std::function<void(const std::string&)> log;

  void say(const std::string& line) const {
    if (log) log(line);
  }
  void size_to(size_t G) {
    held.resize(G, -1);
    expected.resize(G, -1);
    sent.resize(G, -1);
  }
  // Ack from generator g (`name`) for the message of version v. Returns the error a probe
  // mismatch is; a failed checksum or a refused delta only makes its next sync a full one.
  std::optional<Error> on_ack(size_t g, const std::string& name, std::int64_t v, const Ack& a) {
    const auto status = static_cast<WeightsStatus>(a.status);
    if (status == WeightsStatus::applied) {
      held[g] = a.value;
      if (a.value == sent[g]) expected[g] = a.value;
      return std::nullopt;
    }
    held[g] = a.value;
    if (v == sent[g]) expected[g] = -1;  // (an older message's failure: the newer one in flight answers for itself)
    if (status == WeightsStatus::probe_mismatch) {
      expected[g] = -1;
      return make_error(ErrorCode::internal, "weight sync: " + name + ", version " + std::to_string(v) +
                                                 ": probe mismatch at position " + std::to_string(a.probe_position) +
                                                 ": " + a.detail);
    }
    say("weight sync: " + name + " did not apply version " + std::to_string(v) + " (" +
        weights_status_name(status) + ": " + a.detail + "); it holds version " + std::to_string(a.value) +
        " and is sent the full weights");
    return std::nullopt;
  }
};

namespace {

// weight_sync.transport nccl: learner 0 makes the group's id, then it (rank 0) and every generator
// (rank g + 1) join at once -- an NCCL join returns only when all ranks have joined -- and the
// coordinator awaits them all.
Task<Status> form_weight_group(ActorContext& here, const WeightSyncPeers& p, int& group,
                               const std::function<void(const std::string&)>& say) {
  const size_t G = p.generators.size();
  for (size_t g = 0; g < G; ++g)
    if (p.alive && !p.alive(g))
      co_return make_error(ErrorCode::peer_failed, "weight sync: " + generator_name(p, g) +
                                                       " is down before the weight group (weight_sync.transport "
                                                       "nccl) formed");
  WeightGroupReq make;
  make.op = 0;
  auto made = request<WeightGroupRep>(here, p.learner, make, kSyncTimeout);
  TROUPE_CO_ASSIGN_OR_RETURN(WeightGroupRep idrep, co_await made);
  const bool nccl = !idrep.id.empty() && idrep.id[0] == 'N';
  for (size_t g = 0; g < G; ++g) {
    const bool shares = p.generators[g].node == p.learner.node;
    if (nccl && shares)
      co_return make_error(ErrorCode::invalid_input,
                           "weight_sync.transport nccl: " + generator_name(p, g) +
                               " shares a process with learner 0; NCCL needs every member in a process of its own, "
                               "on a GPU of its own: run the generators on ranks of their own (mpirun/srun)");
    if (!nccl && !shares)
      co_return make_error(ErrorCode::invalid_input,
                           "weight_sync.transport nccl: policy.device has no device collectives, so the weight "
                           "group is in-process, but " + generator_name(p, g) + " runs in another process than "
                           "learner 0 (node " + std::to_string(p.learner.node) + ")");
  }
  const int nranks = static_cast<int>(G) + 1;
  std::vector<Reply<WeightGroupRep>> joins;
  WeightGroupReq join;
  join.op = 1;
  join.id = idrep.id;
  join.nranks = nranks;
  join.rank = 0;
  joins.push_back(request<WeightGroupRep>(here, p.learner, join, kSyncTimeout));
  for (size_t g = 0; g < G; ++g) {
    join.rank = static_cast<int>(g) + 1;
    joins.push_back(request<WeightGroupRep>(here, p.generators[g], join, kSyncTimeout));
  }
  for (size_t i = 0; i < joins.size(); ++i) {
    Result<WeightGroupRep> r = co_await joins[i];
    if (!r.ok())
      co_return make_error(r.error().code, "weight sync: " + (i == 0 ? std::string("learner 0") : generator_name(p, i - 1)) +
                                               " could not join the weight group: " + r.error().message);
  }
  group = 1;
  if (say) say("weight sync: learner 0 and " + std::to_string(G) + " generator(s) joined the weight group (" +
      (nccl ? "NCCL" : "in-process") + "); weights go by broadcast");
  co_return Status{};
}

}  // namespace

WeightSync::WeightSync(WeightSyncSection cfg, bool async) : st_(std::make_shared<State>()) {
  st_->cfg = std::move(cfg);
  st_->async = async;
}
WeightSync::~WeightSync() = default;
WeightSync::WeightSync(WeightSync&&) noexcept = default;
WeightSync& WeightSync::operator=(WeightSync&&) noexcept = default;

std::int64_t WeightSync::held(size_t g) const { return g < st_->held.size() ? st_->held[g] : -1; }

Task<Result<WeightSyncReport>> WeightSync::sync(ActorContext& here, const WeightSyncPeers& p) {
  std::shared_ptr<State> st = st_;  // async Acks may outlive this call
  const double t0 = steady_s();
  if (st->async_failure) {
    Error e = *st->async_failure;
    st->async_failure.reset();
    co_return e;
  }
  const size_t G = p.generators.size();
  st->size_to(G);
  st->log = p.log;
  std::vector<size_t> live;  // a generator whose rank died is skipped (rollout.cpp's failover)
  for (size_t g = 0; g < G; ++g)
    if (!p.alive || p.alive(g)) live.push_back(g);
  if (live.empty()) co_return make_error(ErrorCode::peer_failed, "weight sync: every generator rank is down");
  // weight_sync.transport nccl: by broadcast while every member of the weight group is alive (a
  // broadcast needs them all); once one is down, over ZeroMQ for the rest of the run.
  bool by_broadcast = false;
  if (st->cfg.transport == WeightTransport::nccl) {
    if (st->group == 0) {
      TROUPE_CO_TRY(co_await form_weight_group(here, p, st->group, st->log));
    }
    if (st->group == 1 && live.size() == G) {
      by_broadcast = true;
    } else if (st->group == 1) {
      st->group = -1;
      st->say("weight sync: a generator is down, so the weight group is not used again: the weights go over "
              "ZeroMQ from now on");
    }
  }

  // A delta goes to the generators that will hold what learner 0 encoded last; the others get
  // the full weights (learner 0 answers in full anyway when the version is a full_every one).
  bool delta_wanted = false;
  if (st->cfg.mode == WeightSyncMode::delta && st->published >= 0)
    for (size_t g : live) delta_wanted = delta_wanted || st->expected[g] == st->published;
  GetWeightsReq ask;
  ask.base_version = delta_wanted && !by_broadcast ? st->published : -1;
  ask.device = by_broadcast;
  auto first_reply = request<Weights>(here, p.learner, ask, kSyncTimeout);
  TROUPE_CO_ASSIGN_OR_RETURN(Weights first, co_await first_reply);
  WeightSyncReport rep;
  rep.version = first.version;
  rep.elements = first.elements ? first.elements : first.params.size();
  st->published = first.version;
  std::optional<Weights> delta, full;
  if (first.encoding == static_cast<std::int32_t>(WeightEncoding::delta))
    delta = std::move(first);
  else
    full = std::move(first);
  std::vector<size_t> to_delta, to_full;
  for (size_t g : live) (delta && st->expected[g] == delta->base_version ? to_delta : to_full).push_back(g);
  if (!to_full.empty() && !full) {
    GetWeightsReq whole;  // base -1: in full
    auto full_reply = request<Weights>(here, p.learner, whole, kSyncTimeout);
    TROUPE_CO_ASSIGN_OR_RETURN(Weights w, co_await full_reply);
    full = std::move(w);
  }
  if (delta) {
    rep.delta_bytes = wire_bytes(*delta);
    rep.changed = delta->changed;
  }
  if (full) rep.full_bytes = wire_bytes(*full);
  rep.delta = static_cast<int>(to_delta.size());
  rep.full = by_broadcast ? 0 : static_cast<int>(to_full.size());
  rep.broadcast = by_broadcast ? static_cast<int>(to_full.size()) : 0;
  rep.bytes_sent = rep.delta_bytes * to_delta.size() + rep.full_bytes * to_full.size();
  const std::int64_t v = rep.version;

  if (st->async) {
    auto send = [&](size_t g, Weights w) {
      st->sent[g] = v;
      st->expected[g] = v;  // (until its Ack says otherwise)
      const std::string name = generator_name(p, g);
      here->request<Ack>(p.generators[g], std::move(w), kSyncTimeout, [st, g, v, name](runtime::Context&, Result<Ack> a) {
        if (!a.ok()) {  // (a dead generator is skipped by the next sync; a live one is sent the full weights)
          if (v == st->sent[g]) st->expected[g] = -1;
          st->say("weight sync: " + name + " did not acknowledge version " + std::to_string(v) + ": " +
                  a.error().message);
          return;
        }
        if (auto e = st->on_ack(g, name, v, *a); e && !st->async_failure) st->async_failure = *e;
      });
    };
    for (size_t i = 0; i < to_delta.size(); ++i)
      send(to_delta[i], i + 1 == to_delta.size() ? std::move(*delta) : Weights(*delta));
    for (size_t i = 0; i < to_full.size(); ++i)
      send(to_full[i], i + 1 == to_full.size() ? std::move(*full) : Weights(*full));
    rep.seconds = steady_s() - t0;
    co_return rep;
  }

  // Sync mode: every Ack is awaited; a generator whose Ack reports a failed checksum or a refused
  // delta is sent the full weights at once (a second failure is an error).
  std::vector<size_t> retry;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::pair<size_t, Weights*>> sends;
    if (round == 0) {
      for (size_t g : to_delta) sends.emplace_back(g, &*delta);
      for (size_t g : to_full) sends.emplace_back(g, &*full);
    } else {
      if (retry.empty()) break;
      if (!full) {
        GetWeightsReq whole;
        auto full_reply = request<Weights>(here, p.learner, whole, kSyncTimeout);
        TROUPE_CO_ASSIGN_OR_RETURN(Weights w, co_await full_reply);
        full = std::move(w);
        rep.full_bytes = wire_bytes(*full);
      }
      for (size_t g : retry) sends.emplace_back(g, &*full);
      rep.full += static_cast<int>(retry.size());
      rep.resent += static_cast<int>(retry.size());
      rep.bytes_sent += rep.full_bytes * retry.size();
      retry.clear();
    }
    std::vector<Reply<Ack>> acks;
    for (size_t i = 0; i < sends.size(); ++i) {
      auto [g, w] = sends[i];
      st->sent[g] = v;
      st->expected[g] = v;
      // The last generator a message goes to gets it moved, not copied (a retry asks learner 0 again).
      const bool last_use = i + 1 == sends.size() || sends[i + 1].second != w;
      if (last_use) {
        acks.push_back(request<Ack>(here, p.generators[g], std::move(*w), kSyncTimeout));
        (delta && w == &*delta ? delta : full).reset();
      } else {
        acks.push_back(request<Ack>(here, p.generators[g], *w, kSyncTimeout));
      }
    }
    for (size_t i = 0; i < acks.size(); ++i) {
      const size_t g = sends[i].first;
      Result<Ack> a = co_await acks[i];
      if (!a.ok()) {
        st->expected[g] = -1;
        if (a.error().code == ErrorCode::peer_failed && p.mark_down) p.mark_down(g);
        if (p.alive && !p.alive(g)) continue;  // (a dead one is skipped)
        co_return a.error();
      }
      if (auto e = st->on_ack(g, generator_name(p, g), v, *a)) co_return *e;
      if (a->status == static_cast<std::int32_t>(WeightsStatus::applied)) continue;
      if (round == 1)
        co_return make_error(ErrorCode::internal, "weight sync: " + generator_name(p, g) +
                                                      " could not apply the full weights of version " +
                                                      std::to_string(v) + " either: " + a->detail);
      retry.push_back(g);
    }
  }
  rep.seconds = steady_s() - t0;
  co_return rep;
}

namespace coord {

Task<Status> sync_weights(RunState& s, double* seconds) {
  if (!s.weight_sync) s.weight_sync = std::make_unique<WeightSync>(s.cfg.weight_sync, s.cfg.rollout.async);
  WeightSyncPeers peers;
  peers.learner = s.peers.learners[0];
  peers.generators = s.peers.generators;
  peers.alive = [&s](size_t g) { return s.generator_alive(g); };
  peers.mark_down = [&s](size_t g) { s.mark_generator_down(g); };
  peers.log = s.hooks.log;
  TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await s.weight_sync->sync(s.here, peers));
  if (!s.live_generator_from(0)) co_return make_error(ErrorCode::peer_failed, "weight sync: every generator is down");
  s.version = rep.version;
  if (seconds) *seconds = rep.seconds;
  co_return Status{};
}

}  // namespace coord
}  // namespace troupe::actors
