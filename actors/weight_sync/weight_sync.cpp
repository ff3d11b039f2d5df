// Weight sync: learner 0's weights, tagged with their version (and a delta's base version), to
// every generator as Weights messages, never through files; every generator acknowledges each
// one (troupe/actors/weight_sync.h says when a generator gets the full weights). Sync mode awaits
// the Acks (the next step samples with the new weights); async mode sends and goes on (the
// generators take the weights after the request they are sampling), and each Ack updates, on
// arrival, what its generator is known to hold.
#include "troupe/actors/weight_sync.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "troupe/actors/messages.h"
#include "troupe/actors/weight_codec.h"
#include "troupe/actors/weight_group.h"
#include "troupe/base/clock.h"
#include "troupe/actors/weight_relay.h"
#include "troupe/actors/weight_shards.h"

namespace troupe::actors {

using runtime::ActorContext;
using runtime::ActorId;
using runtime::Reply;
using runtime::request;
using runtime::Task;

namespace {

constexpr auto kSyncTimeout = std::chrono::hours(2);

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
  std::uint64_t transmissions = 0;     // weights_from_shards: the pieced messages sent so far (their numbers)
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

// What one sync sends: learner 0's answer (a delta, or the full weights) and the full weights when
// a generator needs them; which live generator gets which.
struct Outgoing {
  std::optional<Weights> delta, full;
  std::vector<size_t> to_delta, to_full;
};

// The live generators (a generator whose rank died is skipped: rollout.cpp's failover).
std::vector<size_t> live_generators(const WeightSyncPeers& p) {
  std::vector<size_t> live;
  for (size_t g = 0; g < p.generators.size(); ++g)
    if (!p.alive || p.alive(g)) live.push_back(g);
  return live;
}

// weight_sync.transport nccl: by broadcast while every member of the weight group is alive (a
// broadcast needs them all); once one is down, over ZeroMQ for the rest of the run.
Task<Result<bool>> by_broadcast(ActorContext& here, const WeightSyncPeers& p, WeightSync::State& st, size_t live) {
  if (st.cfg.transport != WeightTransport::nccl) co_return false;
  if (st.group == 0) {
    TROUPE_CO_TRY(co_await form_weight_group(here, p, st.group, st.log));
  }
  if (st.group == 1 && live == p.generators.size()) co_return true;
  if (st.group == 1) {
    st.group = -1;
    st.say("weight sync: a generator is down, so the weight group is not used again: the weights go over "
           "ZeroMQ from now on");
  }
  co_return false;
}

// Learner 0's answer to `ask` (weights_from_shards goes through sync_pieces instead).
Task<Result<Weights>> ask_learners(ActorContext& here, const WeightSyncPeers& p, const GetWeightsReq& ask) {
  auto reply = request<Weights>(here, p.learner, ask, kSyncTimeout);
  co_return co_await reply;
}

// Learner 0's full weights (GetWeightsReq base -1).
Task<Result<Weights>> full_weights(ActorContext& here, const WeightSyncPeers& p) {
  GetWeightsReq whole;  // base -1: in full
  co_return co_await ask_learners(here, p, whole);
}

// A delta goes to the generators that will hold what learner 0 encoded last; the others get
// the full weights (learner 0 answers in full anyway when the version is a full_every one).
Task<Status> fetch(ActorContext& here, const WeightSyncPeers& p, WeightSync::State& st, const std::vector<size_t>& live,
                   bool broadcast, Outgoing& out, WeightSyncReport& rep) {
  bool delta_wanted = false;
  if (st.cfg.mode == WeightSyncMode::delta && st.published >= 0)
    for (size_t g : live) delta_wanted = delta_wanted || st.expected[g] == st.published;
  GetWeightsReq ask;
  ask.base_version = delta_wanted && !broadcast ? st.published : -1;
  ask.device = broadcast;
  TROUPE_CO_ASSIGN_OR_RETURN(Weights first, co_await ask_learners(here, p, ask));
  rep.version = first.version;
  rep.elements = first.elements ? first.elements : first.params.size();
  st.published = first.version;
  if (first.encoding == static_cast<std::int32_t>(WeightEncoding::delta))
    out.delta = std::move(first);
  else
    out.full = std::move(first);
  for (size_t g : live) (out.delta && st.expected[g] == out.delta->base_version ? out.to_delta : out.to_full).push_back(g);
  if (!out.to_full.empty() && !out.full) {
    TROUPE_CO_ASSIGN_OR_RETURN(Weights w, co_await full_weights(here, p));
    out.full = std::move(w);
  }
  if (out.delta) {
    rep.delta_bytes = wire_bytes(*out.delta);
    rep.changed = out.delta->changed;
  }
  if (out.full) rep.full_bytes = wire_bytes(*out.full);
  rep.delta = static_cast<int>(out.to_delta.size());
  rep.full = broadcast ? 0 : static_cast<int>(out.to_full.size());
  rep.broadcast = broadcast ? static_cast<int>(out.to_full.size()) : 0;
  rep.bytes_sent = rep.delta_bytes * out.to_delta.size() + rep.full_bytes * out.to_full.size();
  co_return Status{};
}

// weight_sync.relay_fanout: more live generators than the fan-out go down a relay tree.
bool by_relay(const WeightSync::State& st, size_t gens) {
  return st.cfg.relay_fanout >= 2 && gens > static_cast<size_t>(st.cfg.relay_fanout);
}

// The root's children for `gens` (each marked sent version v): the relay tree's first level, with
// root_only generators as children without a subtree; or, for the star, every generator alone.
std::vector<RelayChild> root_children(const runtime::ActorSystem& sys, const WeightSyncPeers& p, WeightSync::State& st,
                                      const std::vector<size_t>& gens, std::int64_t v, bool tree) {
  std::vector<RelayTarget> targets, leaves;  // leaves: root_only generators, the root's children without a subtree
  bool members = false;                      // a member that joined relays: every target's address goes along
  for (size_t g : gens) {
    st.sent[g] = v;
    st.expected[g] = v;
    const bool leaf = !tree || (p.root_only && p.root_only(g));
    members = members || (!leaf && p.joined && p.joined(g));
    (leaf ? leaves : targets).push_back({p.generators[g], static_cast<std::int32_t>(g), {}, {}});
  }
  if (members) address_targets(sys, targets);
  std::vector<RelayChild> children = relay_children(targets, st.cfg.relay_fanout);
  for (const RelayTarget& t : leaves) children.push_back(RelayChild{t, {}});
  return children;
}

// Sends `w` down a relay tree over `gens` (weight_relay.h); `done` gets the merged RelayAck.
std::shared_ptr<RelayFanout> start_relay(ActorContext& here, const WeightSyncPeers& p, WeightSync::State& st,
                                         const Weights& w, const std::vector<size_t>& gens, std::int64_t v,
                                         RelayFanout::Done done) {
  const int fanout = st.cfg.relay_fanout;
  auto fan = std::make_shared<RelayFanout>(root_children(here->system(), p, st, gens, v, true), fanout, false, std::move(done));
  for (const WeightsPart& part : weights_parts(w)) fan->forward(*here, part);
  return fan;
}

// A relay's merged Acks, as send_round takes a Weights request's: a generator found down is
// skipped (peer_failed) or fails the sync; one that did not apply goes into *retry (round 0).
Status take_relay_ack(const WeightSyncPeers& p, WeightSync::State& st,
                      const RelayAck& a, std::int64_t v, std::vector<size_t>& retry, WeightSyncReport& rep) {
  rep.relayed_bytes += a.relayed_bytes;
  for (size_t i = 0; i < a.down.size(); ++i) {
    const auto g = static_cast<size_t>(a.down[i]);
    if (g >= st.expected.size()) continue;
    st.expected[g] = -1;
    const bool gone = i < a.down_code.size() && a.down_code[i] == static_cast<std::int32_t>(ErrorCode::peer_failed);
    if (gone && p.mark_down) p.mark_down(g);
    st.say("weight sync: " + generator_name(p, g) + " did not relay version " + std::to_string(v) + " (" +
           (i < a.why.size() ? a.why[i] : std::string()) + "); its children were sent it from its parent");
    if (!gone || (p.alive && p.alive(g))) retry.push_back(g);
  }
  for (size_t i = 0; i < a.index.size() && i < a.acks.size(); ++i) {
    const auto g = static_cast<size_t>(a.index[i]);
    if (g >= st.expected.size()) continue;
    if (auto e = st.on_ack(g, generator_name(p, g), v, a.acks[i])) return *e;
    if (a.acks[i].status != static_cast<std::int32_t>(WeightsStatus::applied)) retry.push_back(g);
  }
  return {};
}

// Sync mode over the relay tree: the delta's and the full weights' trees at once, every Ack
// awaited; what did not apply is retried as send_awaited retries (the full weights, from learner 0).
Task<Status> relay_round(ActorContext& here, const WeightSyncPeers& p, WeightSync::State& st, Outgoing& out,
                         WeightSyncReport& rep, std::vector<size_t>& retry) {
  std::vector<Reply<RelayAck>> acks;
  std::vector<std::shared_ptr<RelayFanout>> fans;
  auto one = [&](const Weights& w, const std::vector<size_t>& gens) {
    auto rs = std::make_shared<Reply<RelayAck>::State>();
    rs->here = &here;
    fans.push_back(start_relay(here, p, st, w, gens, rep.version, [rs](runtime::Context& c, RelayAck a) {
      rs->result.emplace(std::move(a));
      if (auto h = std::exchange(rs->waiter, {})) {
        ActorContext::Scope scope(*rs->here, c);
        h.resume();
      }
    }));
    acks.emplace_back(rs);
  };
  if (!out.to_delta.empty()) one(*out.delta, out.to_delta);
  if (!out.to_full.empty()) one(*out.full, out.to_full);
  for (auto& r : acks) {
    Result<RelayAck> a = co_await r;
    if (!a.ok()) co_return a.error();
    TROUPE_CO_TRY(take_relay_ack(p, st, *a, rep.version, retry, rep));
  }
  rep.bytes_sent = 0;
  for (const auto& f : fans) rep.bytes_sent += f->egress_bytes();
  co_return Status{};
}

// Async mode: every message sent, none awaited; each Ack updates what its generator holds when it
// comes (a probe mismatch is kept for the next sync to return).
void send_unawaited(ActorContext& here, const WeightSyncPeers& p, const std::shared_ptr<WeightSync::State>& st,
                    Outgoing& out, std::int64_t v, WeightSyncReport& rep) {
  if (by_relay(*st, out.to_delta.size() + out.to_full.size())) {  // each tree's Acks recorded as they come
    rep.bytes_sent = 0;
    for (auto [w, gens] : {std::pair{&out.delta, &out.to_delta}, std::pair{&out.full, &out.to_full}}) {
      if (gens->empty()) continue;
      auto fan = start_relay(here, p, *st, **w, *gens, v, [st, p, v](runtime::Context&, RelayAck a) {
        std::vector<size_t> failed;
        WeightSyncReport ignored;
        Status s = take_relay_ack(p, *st, a, v, failed, ignored);
        for (size_t g : failed) st->expected[g] = -1;  // sent the full weights next time
        if (!s.ok() && !st->async_failure) st->async_failure = s.error();
      });
      rep.bytes_sent += fan->egress_bytes();
    }
    return;
  }
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
  for (size_t i = 0; i < out.to_delta.size(); ++i)
    send(out.to_delta[i], i + 1 == out.to_delta.size() ? std::move(*out.delta) : Weights(*out.delta));
  for (size_t i = 0; i < out.to_full.size(); ++i)
    send(out.to_full[i], i + 1 == out.to_full.size() ? std::move(*out.full) : Weights(*out.full));
}

// One round of sync mode: sends[i] to its generator, every Ack awaited. A generator whose Ack
// reports a failed checksum or a refused delta goes into *retry (round 0) or fails the sync (round 1).
Task<Status> send_round(ActorContext& here, const WeightSyncPeers& p, WeightSync::State& st, Outgoing& out,
                        const std::vector<std::pair<size_t, Weights*>>& sends, std::int64_t v, int round,
                        std::vector<size_t>& retry) {
  std::vector<Reply<Ack>> acks;
  for (size_t i = 0; i < sends.size(); ++i) {
    auto [g, w] = sends[i];
    st.sent[g] = v;
    st.expected[g] = v;
    // The last generator a message goes to gets it moved, not copied (a retry asks learner 0 again).
    const bool last_use = i + 1 == sends.size() || sends[i + 1].second != w;
    if (last_use) {
      acks.push_back(request<Ack>(here, p.generators[g], std::move(*w), kSyncTimeout));
      (out.delta && w == &*out.delta ? out.delta : out.full).reset();
    } else {
      acks.push_back(request<Ack>(here, p.generators[g], *w, kSyncTimeout));
    }
  }
  for (size_t i = 0; i < acks.size(); ++i) {
    const size_t g = sends[i].first;
    Result<Ack> a = co_await acks[i];
    if (!a.ok()) {
      st.expected[g] = -1;
      if (a.error().code == ErrorCode::peer_failed && p.mark_down) p.mark_down(g);
      if (p.alive && !p.alive(g)) continue;  // (a dead one is skipped)
      co_return a.error();
    }
    if (auto e = st.on_ack(g, generator_name(p, g), v, *a)) co_return *e;
    if (a->status == static_cast<std::int32_t>(WeightsStatus::applied)) continue;
    if (round == 1)
      co_return make_error(ErrorCode::internal, "weight sync: " + generator_name(p, g) +
                                                    " could not apply the full weights of version " +
                                                    std::to_string(v) + " either: " + a->detail);
    retry.push_back(g);
  }
  co_return Status{};
}

// Sync mode: every Ack is awaited; a generator whose Ack reports a failed checksum or a refused
// delta is sent the full weights at once (a second failure is an error).
Task<Status> send_awaited(ActorContext& here, const WeightSyncPeers& p, WeightSync::State& st, Outgoing& out,
                          WeightSyncReport& rep) {
  std::vector<std::pair<size_t, Weights*>> sends;
  std::vector<size_t> retry;
  if (by_relay(st, out.to_delta.size() + out.to_full.size())) {
    TROUPE_CO_TRY(co_await relay_round(here, p, st, out, rep, retry));
  } else {
    for (size_t g : out.to_delta) sends.emplace_back(g, &*out.delta);
    for (size_t g : out.to_full) sends.emplace_back(g, &*out.full);
    TROUPE_CO_TRY(co_await send_round(here, p, st, out, sends, rep.version, 0, retry));
  }
  if (retry.empty()) co_return Status{};
  if (!out.full) {
    TROUPE_CO_ASSIGN_OR_RETURN(Weights w, co_await full_weights(here, p));
    out.full = std::move(w);
    rep.full_bytes = wire_bytes(*out.full);
  }
  sends.clear();
  for (size_t g : retry) sends.emplace_back(g, &*out.full);
  rep.full += static_cast<int>(retry.size());
  rep.resent += static_cast<int>(retry.size());
  rep.bytes_sent += rep.full_bytes * retry.size();
  std::vector<size_t> again;
  co_return co_await send_round(here, p, st, out, sends, rep.version, 1, again);
}

// ---- weights_from_shards: the learners send their pieces straight to the generators ----
// (weight_pieces.h). The coordinator asks every learner to encode its piece and gets the heads
// only; it joins them (join_piece_heads), sends the joined head to each of the root's children
// (the relay tree's first level, or every generator of the star) and has every learner send its
// piece's payload to them; each child puts the message together, passes it on down its subtree
// and answers with the subtree's RelayAck. Rank 0 holds learner 0's piece, never the whole message.

// One message in pieces: the joined head, where each learner's piece goes in its payload (the
// (first byte, bytes) of each of its runs; none: it sends nothing) and the payload's bytes.
struct PiecedMessage {
  Weights head;
  std::vector<std::vector<std::uint64_t>> spans;
  std::uint64_t total = 0;
  int pieces = 0;  // the learners that send
};

Error learner_failed(const WeightSyncPeers& p, size_t r, const Error& e, const std::string& doing) {
  return make_error(e.code, "weight sync: learner " + std::to_string(r) + " (node " +
                                std::to_string(p.shard_learners[r].node) + ") failed while " + doing + ": " + e.message);
}

// Whether the learners' heads mix full pieces and deltas (a lean encoder sends a large delta in full);
// a learner that sends nothing (divided experts: beyond the first group) has none.
bool mixed_encodings(const std::vector<Weights>& heads) {
  std::optional<std::int32_t> enc;
  for (const Weights& h : heads) {
    if (h.elements == 0 && h.runs.empty()) continue;
    if (enc && h.encoding != *enc) return true;
    enc = h.encoding;
  }
  return false;
}

// Every learner's head for `ask` (all asked at once: the probe runs collectives), joined. When some
// learners answered a delta and others in full, every learner is asked again in full (the same
// version), so the message has one encoding.
Task<Result<PiecedMessage>> ask_pieces(ActorContext& here, const WeightSyncPeers& p, GetWeightsReq ask) {
  std::vector<Weights> heads;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::vector<Reply<Weights>> replies;
    for (const auto& l : p.shard_learners) replies.push_back(request<Weights>(here, l, ask, kSyncTimeout));
    heads.clear();
    std::optional<Error> failed;
    for (size_t r = 0; r < replies.size(); ++r) {
      Result<Weights> w = co_await replies[r];
      if (!w.ok() && !failed) failed = learner_failed(p, r, w.error(), "encoding its piece");
      if (w.ok()) heads.push_back(std::move(w).value());
    }
    if (failed) co_return *failed;
    if (!mixed_encodings(heads)) break;
    ask.base_version = -1;  // (in full: every learner holds the version already)
    if (p.log) p.log("weight sync: version " + std::to_string(heads[0].version) + ": some learners' pieces are deltas, "
                     "others went in full (too large a delta); every learner is asked in full");
  }
  PiecedMessage m;
  TROUPE_CO_ASSIGN_OR_RETURN(m.head, join_piece_heads(heads, &m.spans));
  m.total = payload_bytes(m.head);
  for (const auto& s : m.spans) m.pieces += s.empty() ? 0 : 1;
  co_return m;
}

// A child that never answered: itself down (with the error's code), its subtree not reached
// (retried in sync mode).
RelayAck unreached(const RelayChild& c, const Error& e) {
  RelayAck a;
  a.down.push_back(c.node.index);
  a.down_code.push_back(static_cast<std::int32_t>(e.code));
  a.why.push_back(e.message);
  for (const RelayTarget& t : c.below) {
    a.down.push_back(t.index);
    a.down_code.push_back(static_cast<std::int32_t>(ErrorCode::internal));
    a.why.push_back("its parent " + std::to_string(c.node.index) + " did not answer: " + e.message);
  }
  return a;
}

// What a transmission awaits in sync mode: each of the root's children's RelayAck, and each
// member's Ack.
struct PiecesPending {
  std::vector<RelayChild> children;
  std::vector<Reply<RelayAck>> relays;
  std::vector<size_t> members;
  std::vector<Reply<Ack>> member_acks;
};

// The joined head to each of the root's children, each a request for its subtree's RelayAck
// (sync mode: into pend.relays; async: each taken as it comes).
void send_heads(ActorContext& here, const WeightSyncPeers& p, const std::shared_ptr<WeightSync::State>& stp,
                const PiecedMessage& m, std::uint64_t send, PiecesPending& pend) {
  PiecesHead h;
  h.send = send;
  h.head = m.head;
  h.payload_bytes = m.total;
  h.fanout = std::max(2, stp->cfg.relay_fanout);
  const std::int64_t v = m.head.version;
  for (const RelayChild& c : pend.children) {
    h.subtree.clear();
    h.index.clear();
    for (const RelayTarget& t : c.below) {
      h.subtree.push_back(t.id.packed());
      h.index.push_back(t.index);
    }
    h.to_index = c.node.index;
    if (!stp->async) {
      pend.relays.push_back(request<RelayAck>(here, c.node.id, h, kSyncTimeout));
      continue;
    }
    here->request<RelayAck>(c.node.id, h, kSyncTimeout, [stp, p, v, c](runtime::Context&, Result<RelayAck> a) {
      std::vector<size_t> failed;
      WeightSyncReport ignored;
      Status s = take_relay_ack(p, *stp, a.ok() ? *a : unreached(c, a.error()), v, failed, ignored);
      for (size_t g : failed) stp->expected[g] = -1;  // sent the full weights next time
      if (!s.ok() && !stp->async_failure) stp->async_failure = s.error();
    });
  }
}

// Members that joined the running job reach rank 0's node only: they get the joined message (the
// pieces' payloads, which the learners send back for them) from the coordinator, as a Weights.
void send_to_members(ActorContext& here, const WeightSyncPeers& p, const std::shared_ptr<WeightSync::State>& stp,
                     Weights joined, PiecesPending& pend, WeightSyncReport& rep) {
  const std::int64_t v = joined.version;
  const auto shared = std::make_shared<const Weights>(std::move(joined));  // (one copy for them all)
  for (size_t g : pend.members) {
    rep.bytes_sent += shared->payload.size();
    if (!stp->async) {
      pend.member_acks.push_back(request<Ack>(here, p.generators[g], shared, kSyncTimeout));
      continue;
    }
    const std::string name = generator_name(p, g);
    here->request<Ack>(p.generators[g], shared, kSyncTimeout, [stp, g, v, name](runtime::Context&, Result<Ack> a) {
      if (!a.ok()) {
        if (v == stp->sent[g]) stp->expected[g] = -1;
        return;
      }
      if (auto e = stp->on_ack(g, name, v, *a); e && !stp->async_failure) stp->async_failure = *e;
    });
  }
}

// A learner's returned piece (SendPieceReq::reply_payload) into the joined payload at its spans.
Status place_piece(const runtime::Bytes& piece, const std::vector<std::uint64_t>& spans, size_t r, std::string& payload) {
  std::uint64_t from = 0;
  for (size_t i = 0; i + 1 < spans.size(); i += 2) {
    if (from + spans[i + 1] > piece.size() || spans[i] + spans[i + 1] > payload.size())
      return make_error(ErrorCode::internal, "weight sync: learner " + std::to_string(r) + " returned a piece of " +
                                                 std::to_string(piece.size()) + " bytes, short of its spans");
    std::copy_n(piece.data() + from, spans[i + 1], payload.data() + spans[i]);
    from += spans[i + 1];
  }
  return {};
}

// One transmission of m to gens: the head to each of the root's children, then every learner's
// piece to them; returns once every learner has sent it (paced in sync mode: taken by every child).
Task<Status> transmit(ActorContext& here, const WeightSyncPeers& p, const std::shared_ptr<WeightSync::State>& stp,
                      const PiecedMessage& m, const std::vector<size_t>& gens, PiecesPending& pend, WeightSyncReport& rep) {
  WeightSync::State& st = *stp;
  const std::int64_t v = m.head.version;
  std::vector<size_t> reached;
  // (members that joined take the joined message from rank 0, relaying or not: a piece's head names
  // no addresses)
  for (size_t g : gens) ((p.root_only && p.root_only(g)) || (p.joined && p.joined(g)) ? pend.members : reached).push_back(g);
  for (size_t g : pend.members) st.sent[g] = st.expected[g] = v;
  pend.children = root_children(here->system(), p, st, reached, v, by_relay(st, reached.size()));
  SendPieceReq send;
  send.send = ++st.transmissions;
  send.version = v;
  send.total = m.total;
  send.paced = !st.async;
  send.reply_payload = !pend.members.empty();
  for (const RelayChild& c : pend.children) send.targets.push_back(c.node.id.packed());
  send_heads(here, p, stp, m, send.send, pend);
  std::vector<std::optional<Reply<SendPieceRep>>> sent(p.shard_learners.size());
  for (size_t r = 0; r < p.shard_learners.size(); ++r) {
    const auto& spans = m.spans[r];
    if (spans.empty()) continue;  // (a learner that sends nothing)
    send.at = spans[0];
    send.spans = spans.size() > 2 ? spans : std::vector<std::uint64_t>{};  // (one run: its bytes from `at` on)
    sent[r].emplace(request<SendPieceRep>(here, p.shard_learners[r], send, kSyncTimeout));
  }
  std::optional<Error> failed;
  std::string payload(pend.members.empty() ? 0 : m.total, '\0');
  for (size_t r = 0; r < sent.size(); ++r) {  // (every reply awaited)
    if (!sent[r]) continue;
    Result<SendPieceRep> a = co_await *sent[r];
    if (!a.ok()) {
      if (!failed) failed = learner_failed(p, r, a.error(), "sending its piece of version " + std::to_string(v));
      continue;
    }
    if (r == 0) rep.bytes_sent += a->bytes;  // (rank 0's traffic: learner 0's piece)
    rep.learner_bytes += a->bytes;
    if (!pend.members.empty()) TROUPE_CO_TRY(place_piece(a->payload, m.spans[r], r, payload));
    if (!a->detail.empty()) st.say("weight sync: learner " + std::to_string(r) + " could not send its piece of version " +
                                   std::to_string(v) + " to every generator: " + a->detail);
  }
  if (failed) co_return *failed;
  if (!pend.members.empty()) {
    Weights joined = m.head;
    joined.payload = runtime::Bytes(std::move(payload));
    send_to_members(here, p, stp, std::move(joined), pend, rep);
  }
  co_return Status{};
}

// Sync mode: one transmission and every RelayAck and Ack awaited; a generator that did not apply it
// goes into *retry (round 0) or fails the sync (round 1: the full weights a second time).
Task<Status> pieces_round(ActorContext& here, const WeightSyncPeers& p, const std::shared_ptr<WeightSync::State>& stp,
                          const PiecedMessage& m, const std::vector<size_t>& gens, int round, WeightSyncReport& rep,
                          std::vector<size_t>& retry) {
  PiecesPending pend;
  Status sent = co_await transmit(here, p, stp, m, gens, pend, rep);
  if (!sent.ok() || stp->async) co_return sent;  // (a learner's failure ends the run: the Acks are not awaited)
  const std::int64_t v = m.head.version;
  std::vector<size_t> failed;
  std::vector<size_t>& again = round == 0 ? retry : failed;
  for (size_t i = 0; i < pend.relays.size(); ++i) {
    Result<RelayAck> a = co_await pend.relays[i];
    TROUPE_CO_TRY(take_relay_ack(p, *stp, a.ok() ? *a : unreached(pend.children[i], a.error()), v, again, rep));
  }
  for (size_t i = 0; i < pend.member_acks.size(); ++i) {
    const size_t g = pend.members[i];
    Result<Ack> a = co_await pend.member_acks[i];
    if (!a.ok()) {
      stp->expected[g] = -1;
      if (a.error().code == ErrorCode::peer_failed && p.mark_down) p.mark_down(g);
      if (!p.alive || p.alive(g)) again.push_back(g);
      continue;
    }
    if (auto e = stp->on_ack(g, generator_name(p, g), v, *a)) co_return *e;
    if (a->status != static_cast<std::int32_t>(WeightsStatus::applied)) again.push_back(g);
  }
  for (size_t g : failed)
    if (!p.alive || p.alive(g))
      co_return make_error(ErrorCode::internal, "weight sync: " + generator_name(p, g) +
                                                    " could not apply the full weights of version " +
                                                    std::to_string(v) + " either");
  co_return Status{};
}

// The whole sync from the pieces: a delta to the generators known to hold its base, the full
// weights to the others (asked of every learner again when the first answer was a delta), and in
// sync mode the full weights once more to any that did not apply what it got.
Task<Status> sync_pieces(ActorContext& here, const WeightSyncPeers& p, const std::shared_ptr<WeightSync::State>& stp,
                         const std::vector<size_t>& live, WeightSyncReport& rep) {
  WeightSync::State& st = *stp;
  bool delta_wanted = false;
  if (st.cfg.mode == WeightSyncMode::delta && st.published >= 0)
    for (size_t g : live) delta_wanted = delta_wanted || st.expected[g] == st.published;
  GetWeightsReq ask, whole;  // (whole: base -1, in full)
  ask.base_version = delta_wanted ? st.published : -1;
  TROUPE_CO_ASSIGN_OR_RETURN(PiecedMessage first, co_await ask_pieces(here, p, ask));
  const Weights& h = first.head;
  rep.version = h.version;
  rep.elements = h.elements;
  rep.pieces = first.pieces;
  st.published = h.version;
  const bool is_delta = h.encoding == static_cast<std::int32_t>(WeightEncoding::delta);
  std::vector<size_t> to_delta, to_full, retry;
  for (size_t g : live) (is_delta && st.expected[g] == h.base_version ? to_delta : to_full).push_back(g);
  if (!to_delta.empty()) {
    rep.delta_bytes = first.total;
    rep.changed = h.changed;
    rep.delta = static_cast<int>(to_delta.size());
    TROUPE_CO_TRY(co_await pieces_round(here, p, stp, first, to_delta, 0, rep, retry));
  }
  if (!to_full.empty()) {
    std::optional<PiecedMessage> full;
    if (is_delta) {
      TROUPE_CO_ASSIGN_OR_RETURN(full, co_await ask_pieces(here, p, whole));
    }
    const PiecedMessage& f = full ? *full : first;
    rep.full_bytes = f.total;
    rep.full = static_cast<int>(to_full.size());
    TROUPE_CO_TRY(co_await pieces_round(here, p, stp, f, to_full, 0, rep, retry));
  }
  if (retry.empty()) co_return Status{};
  TROUPE_CO_ASSIGN_OR_RETURN(PiecedMessage again, co_await ask_pieces(here, p, whole));
  rep.full_bytes = again.total;
  rep.full += static_cast<int>(retry.size());
  rep.resent += static_cast<int>(retry.size());
  std::vector<size_t> none;
  co_return co_await pieces_round(here, p, stp, again, retry, 1, rep, none);
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
  const double t0 = mono_seconds();
  if (st->async_failure) {
    Error e = *st->async_failure;
    st->async_failure.reset();
    co_return e;
  }
  st->size_to(p.generators.size());
  st->log = p.log;
  const std::vector<size_t> live = live_generators(p);
  if (live.empty()) co_return make_error(ErrorCode::peer_failed, "weight sync: every generator rank is down");
  TROUPE_CO_ASSIGN_OR_RETURN(const bool broadcast, co_await by_broadcast(here, p, *st, live.size()));
  WeightSyncReport rep;
  if (!p.shard_learners.empty() && !broadcast) {  // weights_from_shards: the pieces straight to the generators
    TROUPE_CO_TRY(co_await sync_pieces(here, p, st, live, rep));
    rep.seconds = mono_seconds() - t0;
    co_return rep;
  }
  Outgoing out;
  TROUPE_CO_TRY(co_await fetch(here, p, *st, live, broadcast, out, rep));
  if (st->async)
    send_unawaited(here, p, st, out, rep.version, rep);
  else
    TROUPE_CO_TRY(co_await send_awaited(here, p, *st, out, rep));
  rep.seconds = mono_seconds() - t0;
  co_return rep;
}

}  // namespace troupe::actors
