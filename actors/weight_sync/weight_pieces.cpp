// The learners' pieces straight to the generators (weight_pieces.h): a learner's runs of its
// piece, paced per target; a generator's assembly of one transmission at the runs' byte offsets,
// passed on down the relay tree as its prefix fills and applied once whole, in transmission order.
#include "troupe/actors/weight_pieces.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>

#include "troupe/actors/weight_format.h"
#include "troupe/actors/weight_relay.h"

namespace troupe::actors {

namespace {

constexpr auto kPieceTimeout = std::chrono::hours(2);  // as a Weights request's (weight_sync.cpp)

// A transmission's payload, assembled in place; the parts passed on and the message applied are
// views of it (runtime::Bytes::shared), so a relay holds it once.
class PieceBuffer final : public runtime::SharedBuffer {
 public:
  explicit PieceBuffer(size_t n) : data_(new char[std::max<size_t>(n, 1)]) {}  // (not zero-filled)
  char* data() { return data_.get(); }

 private:
  std::unique_ptr<char[]> data_;
};

Ack refused_ack(std::int64_t held, std::int64_t version, std::string why) {
  Ack a;
  a.value = held;
  a.version = version;
  a.status = static_cast<std::int32_t>(WeightsStatus::refused);
  a.detail = std::move(why);
  return a;
}

}  // namespace

// ---- a learner's side ----

PieceSender::PieceSender(runtime::Bytes payload, SendPieceReq req, Done done)
    : PieceSender(std::vector<runtime::Bytes>{std::move(payload)}, std::move(req), std::move(done)) {}

PieceSender::PieceSender(std::vector<runtime::Bytes> payloads, SendPieceReq req, Done done)
    : payloads_(std::move(payloads)), req_(std::move(req)), done_(std::move(done)) {
  for (size_t p = 0; p < payloads_.size(); ++p) {
    const std::uint64_t at = req_.spans.empty() ? req_.at : req_.spans[2 * p];
    for (size_t from = 0; from < payloads_[p].size(); from += kPieceRunBytes)
      blocks_.push_back({p, from, std::min(kPieceRunBytes, payloads_[p].size() - from), at + from});
  }
  runs_ = blocks_.size();
  for (auto packed : req_.targets) targets_.push_back(Target{runtime::ActorId::unpack(packed)});
}

std::string PieceSender::mismatch(const std::vector<runtime::Bytes>& payloads, const SendPieceReq& req) {
  if (req.spans.empty())
    return payloads.size() == 1 ? "" : "a piece of " + std::to_string(payloads.size()) + " runs was asked to go to one offset";
  if (req.spans.size() != 2 * payloads.size())
    return "a piece of " + std::to_string(payloads.size()) + " runs was asked to go to " +
           std::to_string(req.spans.size() / 2) + " spans";
  for (size_t p = 0; p < payloads.size(); ++p)
    if (req.spans[2 * p + 1] != payloads[p].size())
      return "run " + std::to_string(p) + " of the piece has " + std::to_string(payloads[p].size()) +
             " bytes, its span " + std::to_string(req.spans[2 * p + 1]);
  return {};
}

WeightsPiece PieceSender::run(size_t k) const {
  const Block& b = blocks_[k];
  WeightsPiece p;
  p.send = req_.send;
  p.total = req_.total;
  p.at = b.at;
  p.bytes = payloads_[b.p].slice(b.from, b.n);  // (a view: no copy)
  return p;
}

void PieceSender::start(runtime::Context& ctx) {
  auto self = shared_from_this();  // (alive until done, whatever the caller keeps)
  if (!req_.paced) {
    for (Target& t : targets_)
      for (size_t k = 0; k < runs_ && !t.failed; ++k) {
        WeightsPiece p = run(k);
        const size_t n = p.bytes.size();
        if (Status st = ctx.send(t.id, std::move(p)); !st.ok()) {
          t.failed = true;
          rep_.detail += "generator actor " + std::to_string(t.id.packed()) + ": " + st.error().message + "; ";
        } else {
          rep_.bytes += n;
        }
      }
    for (Target& t : targets_) t.next = runs_;
  } else {
    ++busy_;
    for (size_t t = 0; t < targets_.size(); ++t) pump(ctx, t);
    --busy_;
  }
  maybe_done(ctx);
}

void PieceSender::pump(runtime::Context& ctx, size_t t) {
  ++busy_;  // (a request that fails at once answers inside ctx.request)
  while (!targets_[t].failed && targets_[t].next < runs_ && targets_[t].in_flight < kPieceWindow) {
    WeightsPiece p = run(targets_[t].next++);
    ++targets_[t].in_flight;
    rep_.bytes += p.bytes.size();
    auto self = shared_from_this();
    ctx.request<Ack>(targets_[t].id, std::move(p), kPieceTimeout,
                     [self, t](runtime::Context& c, Result<Ack> a) { self->on_ack(c, t, std::move(a)); });
  }
  --busy_;
}

void PieceSender::on_ack(runtime::Context& ctx, size_t t, Result<Ack> a) {
  Target& T = targets_[t];
  --T.in_flight;
  const bool ok = a.ok() && a->status == static_cast<std::int32_t>(WeightsStatus::applied);
  if (!ok && !T.failed) {
    T.failed = true;
    rep_.detail += "generator actor " + std::to_string(T.id.packed()) + ": " +
                   (a.ok() ? a->detail : a.error().message) + "; ";
  }
  if (busy_ > 0) return;  // (the sending loop goes on)
  pump(ctx, t);
  maybe_done(ctx);
}

void PieceSender::maybe_done(runtime::Context& ctx) {
  if (finished_ || busy_ > 0) return;
  for (const Target& t : targets_)
    if (t.in_flight > 0 || (!t.failed && t.next < runs_)) return;
  finished_ = true;
  payloads_.clear();
  Done done = std::move(done_);
  done(ctx, std::move(rep_));
}

// ---- a generator's side ----

struct PiecesReceiver::Assembly {
  std::uint64_t send = 0, total = 0;
  PieceBuffer* buf = nullptr;
  std::map<std::uint64_t, std::uint64_t> runs;  // received [start, end), merged
  std::uint64_t prefix = 0;                     // bytes [0, prefix) are in
  std::optional<PiecesHead> head;
  runtime::ReplyTo reply;
  std::shared_ptr<RelayFanout> out;
  std::int32_t parts = 0, forwarded = 0;
  std::string failed;  // why this transmission cannot be assembled ("" while it can)

  ~Assembly() {
    if (buf) buf->release();
  }
  // Copies run p in; "" or why it does not fit.
  std::string add(const WeightsPiece& p) {
    const std::uint64_t a = p.at, b = p.at + p.bytes.size();
    if (p.total != total || b > total)
      return "a run of bytes [" + std::to_string(a) + ", " + std::to_string(b) + ") of a payload of " +
             std::to_string(p.total) + " for one of " + std::to_string(total);
    auto next = runs.upper_bound(a);
    if ((next != runs.end() && next->first < b) || (next != runs.begin() && std::prev(next)->second > a))
      return "a run of bytes [" + std::to_string(a) + ", " + std::to_string(b) + ") that was received already";
    if (a == b) return {};
    std::memcpy(buf->data() + a, p.bytes.data(), p.bytes.size());
    std::uint64_t s = a, e = b;
    if (next != runs.begin() && std::prev(next)->second == a) {
      s = std::prev(next)->first;
      runs.erase(std::prev(next));
    }
    if (next != runs.end() && next->first == b) {
      e = next->second;
      runs.erase(next);
    }
    runs[s] = e;
    if (!runs.empty() && runs.begin()->first == 0) prefix = runs.begin()->second;
    return {};
  }
  // Part k of the message as the relay tree carries it (weights_parts' cut: kRelayPartBytes each).
  WeightsPart part(std::int32_t k) const {
    WeightsPart p;
    p.version = head->head.version;
    p.part = k;
    p.parts = parts;
    if (k == 0) p.head = head->head;
    const std::uint64_t from = static_cast<std::uint64_t>(k) * kRelayPartBytes;
    const std::uint64_t len = std::min<std::uint64_t>(kRelayPartBytes, total - std::min(total, from));
    if (len > 0) p.bytes = runtime::Bytes::shared(buf, buf->data() + from, len);
    return p;
  }
  std::uint64_t part_end(std::int32_t k) const {
    return std::min<std::uint64_t>(total, static_cast<std::uint64_t>(k + 1) * kRelayPartBytes);
  }
};

PiecesReceiver::PiecesReceiver() = default;
PiecesReceiver::~PiecesReceiver() = default;

PiecesReceiver::Assembly& PiecesReceiver::assembly(std::uint64_t send, std::uint64_t total) {
  auto& slot = sends_[send];
  if (!slot) {
    slot = std::make_unique<Assembly>();
    slot->send = send;
    slot->total = total;
    slot->buf = new PieceBuffer(total);
    if (total == 0) slot->runs[0] = 0;
  }
  return *slot;
}

void PiecesReceiver::on_head(runtime::Context& ctx, const PiecesHead& h, const Apply& apply) {
  runtime::ReplyTo reply = ctx.reply_later();
  if (h.send < finished_below_) {  // (never expected: the coordinator numbers its transmissions)
    RelayAck r;
    r.index.push_back(h.to_index);
    r.acks.push_back(refused_ack(-1, h.head.version, "weight sync: transmission " + std::to_string(h.send) +
                                                         " came after a later one was done"));
    if (reply) (void)reply.send(std::move(r));
    return;
  }
  Assembly& a = assembly(h.send, h.payload_bytes);
  if (a.total != h.payload_bytes && a.failed.empty())
    a.failed = "its head says " + std::to_string(h.payload_bytes) + " payload bytes, its pieces " +
               std::to_string(a.total);
  a.head = h;
  a.reply = reply;
  advance(ctx, apply);
}

Status PiecesReceiver::on_piece(runtime::Context& ctx, const WeightsPiece& p, const Apply& apply) {
  const bool request = ctx.header() && (ctx.header()->flags & runtime::kFlagRequest);
  std::string why;
  if (p.send < finished_below_) {
    why = "a run of transmission " + std::to_string(p.send) + ", which is over";
  } else {
    Assembly& a = assembly(p.send, p.total);
    if (a.failed.empty()) a.failed = a.add(p);
    why = a.failed;
  }
  if (request) {
    Ack ack = why.empty() ? Ack{} : refused_ack(-1, -1, "weight sync: " + why);
    TROUPE_TRY(ctx.reply(std::move(ack)));
  }
  advance(ctx, apply);
  return {};
}

void PiecesReceiver::advance(runtime::Context& ctx, const Apply& apply) {
  while (!sends_.empty()) {
    Assembly& a = *sends_.begin()->second;
    if (!a.head) return;  // (the coordinator's head is on its way)
    const PiecesHead& h = *a.head;
    if (!a.out) {
      std::vector<RelayTarget> below;
      for (size_t i = 0; i < h.subtree.size() && i < h.index.size(); ++i)
        below.push_back({runtime::ActorId::unpack(h.subtree[i]), h.index[i], {}, {}});
      runtime::ReplyTo reply = a.reply;
      a.out = std::make_shared<RelayFanout>(relay_children(below, h.fanout), h.fanout, true,
                                            [reply](runtime::Context&, RelayAck r) {
                                              if (reply) (void)reply.send(std::move(r));
                                            });
      a.parts = static_cast<std::int32_t>(std::max<std::uint64_t>(1, (a.total + kRelayPartBytes - 1) / kRelayPartBytes));
    }
    if (!a.failed.empty()) {
      // Nothing more can come of it: this generator and its subtree are reported, the subtree as not
      // reached (its parent's sync sends them the full weights again), without a last part sent.
      RelayAck r;
      const std::string why = "weight sync: version " + std::to_string(h.head.version) + " could not be assembled: " +
                              a.failed;
      r.index.push_back(h.to_index);
      r.acks.push_back(refused_ack(-1, h.head.version, why));
      for (std::int32_t g : h.index) {
        r.down.push_back(g);
        r.down_code.push_back(static_cast<std::int32_t>(ErrorCode::invalid_input));
        r.why.push_back(why);
      }
      if (a.reply) (void)a.reply.send(std::move(r));
      finished_below_ = a.send + 1;
      sends_.erase(sends_.begin());
      continue;
    }
    while (a.forwarded < a.parts && a.part_end(a.forwarded) <= a.prefix) {
      const WeightsPart p = a.part(a.forwarded++);
      a.out->forward(ctx, p);
    }
    if (a.forwarded < a.parts) return;  // (more of its payload to come)
    Weights w = h.head;
    if (a.total > 0) w.payload = runtime::Bytes::shared(a.buf, a.buf->data(), a.total);
    Ack own = apply(w);
    auto out = std::move(a.out);
    const std::int32_t to_index = h.to_index;
    finished_below_ = a.send + 1;
    sends_.erase(sends_.begin());
    out->own(ctx, to_index, std::move(own));
  }
}

}  // namespace troupe::actors
