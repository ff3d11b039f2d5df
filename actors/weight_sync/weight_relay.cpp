// The relay tree (weight_relay.h): parts of a Weights message, the split of a subtree among a
// sender's children, and a sender's fan-out with its route-around. Every generator of a subtree
// ends up in the merged RelayAck, with its Ack or among the ones found down.
#include "troupe/actors/weight_relay.h"

#include "troupe/actors/weight_format.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <utility>

namespace troupe::actors {

namespace {
constexpr auto kRelayTimeout = std::chrono::hours(2);  // as a Weights request's (weight_sync.cpp)
}  // namespace

std::vector<RelayChild> relay_children(const std::vector<RelayTarget>& subtree, int fanout) {
  std::vector<RelayChild> out;
  const size_t n = subtree.size();
  if (n == 0) return out;
  const size_t k = std::min(n, static_cast<size_t>(std::max(fanout, 1)));
  size_t at = 0;
  for (size_t c = 0; c < k; ++c) {
    const size_t len = n / k + (c < n % k ? 1 : 0);
    RelayChild child;
    child.node = subtree[at];
    child.below.assign(subtree.begin() + static_cast<std::ptrdiff_t>(at + 1),
                       subtree.begin() + static_cast<std::ptrdiff_t>(at + len));
    out.push_back(std::move(child));
    at += len;
  }
  return out;
}

std::vector<RelayTarget> relay_targets(const WeightsPart& p) {
  std::vector<RelayTarget> out;
  for (size_t i = 0; i < p.subtree.size() && i < p.index.size(); ++i) {
    out.push_back({runtime::ActorId::unpack(p.subtree[i]), p.index[i], {}, {}});
    if (i < p.endpoints.size() && i < p.keys.size()) {
      out.back().endpoint = p.endpoints[i];
      out.back().key = p.keys[i];
    }
  }
  return out;
}

void address_targets(const runtime::ActorSystem& sys, std::vector<RelayTarget>& targets) {
  std::unordered_map<std::uint32_t, runtime::PeerInfo> book;
  for (runtime::PeerInfo& p : sys.peers()) book.emplace(p.node, std::move(p));
  book[sys.node_id()] = runtime::PeerInfo{sys.node_id(), sys.endpoint(), "", sys.curve_public_key()};
  for (RelayTarget& t : targets)
    if (auto it = book.find(t.id.node); it != book.end()) {
      t.endpoint = it->second.endpoint;
      t.key = it->second.curve_public_key;
    }
}

Status connect_target(runtime::ActorSystem& sys, const RelayTarget& t) {
  if (t.endpoint.empty() || t.id.node == sys.node_id()) return {};
  // ("joined-": a peer the job survives losing, as a member that joined it)
  return sys.connect({runtime::PeerInfo{t.id.node, t.endpoint, "joined-relay", t.key}});
}

std::vector<WeightsPart> weights_parts(const Weights& w, size_t part_bytes) {
  part_bytes = std::max<size_t>(part_bytes, 1);
  const size_t total = w.payload.size();
  const size_t n = std::max<size_t>(1, (total + part_bytes - 1) / part_bytes);
  std::vector<WeightsPart> parts(n);
  const char* data = w.payload.data();
  for (size_t i = 0; i < n; ++i) {
    WeightsPart& p = parts[i];
    p.version = w.version;
    p.part = static_cast<std::int32_t>(i);
    p.parts = static_cast<std::int32_t>(n);
    const size_t from = i * part_bytes, len = std::min(part_bytes, total - std::min(total, from));
    if (len > 0) p.bytes = runtime::Bytes(data + from, len);
  }
  Weights& head = parts[0].head;
  head.version = w.version;
  head.params = w.params;
  head.base_version = w.base_version;
  head.encoding = w.encoding;
  head.dtype = w.dtype;
  head.elements = w.elements;
  head.chunk_elements = w.chunk_elements;
  head.chunk_bytes = w.chunk_bytes;
  head.chunk_format = w.chunk_format;
  head.checksums = w.checksums;
  head.changed = w.changed;
  head.probe_tokens = w.probe_tokens;
  head.probe_logprobs = w.probe_logprobs;
  head.chunk_starts = w.chunk_starts;
  return parts;
}

bool PartAssembly::add(const WeightsPart& p) {
  if (p.part == 0) {
    head_ = p.head;
    payload_.clear();
    std::size_t announced = 0;  // (a streamed delta reads the bytes in place: they must not move)
    for (auto b : p.head.chunk_bytes) announced += b;
    const std::size_t most = static_cast<std::size_t>(std::max(p.parts, 1)) * std::max(p.bytes.size(), kRelayPartBytes);
    payload_.reserve(std::min(announced, most));  // (a head announcing more cannot be streamed: fits() says no)
    version_ = p.version;
    next_ = 0;
    parts_ = p.parts;
  }
  if (!head_ || p.version != version_ || p.part != next_ || p.parts != parts_) return false;
  payload_.append(p.bytes.data(), p.bytes.size());
  ++next_;
  return true;
}

Weights PartAssembly::take() {
  Weights w = std::move(*head_);
  head_.reset();
  w.payload = runtime::Bytes(std::move(payload_));
  payload_ = {};
  return w;
}

RelayFanout::RelayFanout(std::vector<RelayChild> children, int fanout, bool own_expected, Done done)
    : children_(std::move(children)), fanout_(fanout), own_expected_(own_expected), done_(std::move(done)) {}

void RelayFanout::send_to(runtime::Context& ctx, const RelayChild& c, const WeightsPart& p) {
  WeightsPart out;
  out.version = p.version;
  out.part = p.part;
  out.parts = p.parts;
  if (p.part == 0) out.head = p.head;
  out.bytes = p.bytes;
  out.fanout = fanout_;
  out.to_index = c.node.index;
  for (const RelayTarget& t : c.below) {
    out.subtree.push_back(t.id.packed());
    out.index.push_back(t.index);
  }
  if (p.part == 0 && !c.node.endpoint.empty()) address_part(ctx, c, out);
  egress_ += p.bytes.size();
  if (p.part + 1 < p.parts) {
    (void)ctx.send(c.node.id, std::move(out));  // (a lost part shows as the last part's refusal)
    return;
  }
  ++pending_;
  auto self = shared_from_this();
  ctx.request<RelayAck>(c.node.id, std::move(out), kRelayTimeout,
                        [self, c](runtime::Context& cx, Result<RelayAck> r) { self->on_reply(cx, c, std::move(r)); });
}

void RelayFanout::address_part(runtime::Context& ctx, const RelayChild& c, WeightsPart& out) {
  runtime::ActorSystem& sys = ctx.system();
  (void)connect_target(sys, c.node);  // (failing, the sends fail too, and the child is routed around)
  for (const RelayTarget& t : c.below) {
    out.endpoints.push_back(t.endpoint);
    out.keys.push_back(t.key);
  }
  out.from_endpoint = sys.endpoint();
  out.from_key = sys.curve_public_key();
}

void RelayFanout::forward(runtime::Context& ctx, const WeightsPart& p) {
  kept_.push_back(p);
  kept_.back().subtree.clear();
  kept_.back().index.clear();
  ++busy_;  // (a request that fails at once answers inside send_to)
  for (const RelayChild& c : children_) send_to(ctx, c, kept_.back());
  --busy_;
  if (p.part + 1 == p.parts) maybe_done(ctx);
}

void RelayFanout::own(runtime::Context& ctx, std::int32_t index, Ack a) {
  merged_.index.insert(merged_.index.begin(), index);
  merged_.acks.insert(merged_.acks.begin(), std::move(a));
  own_given_ = true;
  maybe_done(ctx);
}

void RelayFanout::on_reply(runtime::Context& ctx, const RelayChild& c, Result<RelayAck> r) {
  --pending_;
  if (r.ok()) {
    RelayAck& a = *r;
    merged_.index.insert(merged_.index.end(), a.index.begin(), a.index.end());
    for (Ack& x : a.acks) merged_.acks.push_back(std::move(x));
    merged_.down.insert(merged_.down.end(), a.down.begin(), a.down.end());
    merged_.down_code.insert(merged_.down_code.end(), a.down_code.begin(), a.down_code.end());
    for (std::string& s : a.why) merged_.why.push_back(std::move(s));
    merged_.relayed_bytes += a.relayed_bytes;
  } else {
    // Routed around: the child's children get every part from here (they may hold it already).
    merged_.down.push_back(c.node.index);
    merged_.down_code.push_back(static_cast<std::int32_t>(r.error().code));
    merged_.why.push_back(r.error().message);
    ++busy_;
    for (const RelayChild& g : relay_children(c.below, fanout_))
      for (const WeightsPart& p : kept_) send_to(ctx, g, p);
    --busy_;
  }
  maybe_done(ctx);
}

void RelayFanout::maybe_done(runtime::Context& ctx) {
  if (finished_ || busy_ > 0 || pending_ > 0 || (own_expected_ && !own_given_)) return;
  if (kept_.empty() || kept_.back().part + 1 != kept_.back().parts) return;  // the last part not sent yet
  finished_ = true;
  kept_.clear();
  if (own_expected_) merged_.relayed_bytes += egress_;
  Done done = std::move(done_);
  done(ctx, std::move(merged_));
}

}  // namespace troupe::actors

namespace troupe::actors {

void RelayReceiver::abort() {
  if (streaming_ && take_.abort) take_.abort(in_.payload().data());
  streaming_ = false;
}

Status RelayReceiver::on_part(runtime::Context& ctx, const WeightsPart& p) {
  if (p.part == 0) {
    abort();  // (sent again around a relay that died: put together from the start)
    if (!p.from_endpoint.empty())  // (a member that joined knows rank 0's node only: the way back to its parent)
      (void)connect_target(ctx.system(), RelayTarget{ctx.sender(), 0, p.from_endpoint, p.from_key});
    reply_ = std::make_shared<runtime::ReplyTo>();
    auto reply = reply_;
    out_ = std::make_shared<RelayFanout>(relay_children(relay_targets(p), p.fanout), p.fanout, true,
                                         [reply](runtime::Context&, RelayAck a) {
                                           if (*reply) (void)reply->send(std::move(a));
                                         });
  }
  if (p.part != 0 && !in_.fits(p)) abort();  // (more bytes than announced: the payload will move)
  const bool in_order = in_.add(p);
  if (!in_order) abort();
  if (p.part == 0 && in_order && p.version != applied_version_ && take_.begin) streaming_ = take_.begin(p.head);
  if (!out_) return make_error(ErrorCode::invalid_input, "weight relay: part " + std::to_string(p.part) + " of version " +
                                                              std::to_string(p.version) + " came before its part 0");
  const bool last = p.part + 1 == p.parts;
  if (last) *reply_ = ctx.reply_later();
  out_->forward(ctx, p);  // passed on before this generator applies it
  if (!last) {
    if (streaming_) take_.feed(in_.payload().data(), in_.payload().size());
    return {};
  }
  Ack a;
  if (in_order && in_.complete()) {
    const bool streamed = std::exchange(streaming_, false);
    Weights w = in_.take();
    if (w.version == applied_version_) {
      if (streamed) take_.abort(w.payload.data());
      a = applied_ack_;  // (sent again around a relay that died: held already)
    } else {
      a = take_.apply(w);  // (finishes what was streamed)
      if (a.status == static_cast<std::int32_t>(WeightsStatus::applied)) {
        applied_version_ = w.version;
        applied_ack_ = a;
      }
    }
  } else {
    abort();
    a.value = applied_version_;
    a.version = p.version;
    a.status = static_cast<std::int32_t>(WeightsStatus::refused);
    a.detail = "weight relay: parts of version " + std::to_string(p.version) + " missing or out of order";
  }
  auto out = std::move(out_);
  out->own(ctx, p.to_index, std::move(a));
  return {};
}

}  // namespace troupe::actors
