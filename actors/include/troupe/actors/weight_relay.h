// The relay tree of weight_sync.relay_fanout (the generators and the scale simulation use it): how a Weights message is cut
// into WeightsParts and put back together, how a subtree is split among a sender's children, and
// RelayFanout, a sender's side (the coordinator's or a relaying generator's): each part goes to
// every child as it comes, the last one as a request; a child that fails is routed around (its
// children get every part from this sender), and the RelayAcks are merged into one. Invariant:
// every generator of the subtree ends up in the merged RelayAck, with its Ack or in `down`.
// Members that joined the job know rank 0's node only: when the tree holds one, every target
// carries its node's address, and a sender connects to a child it does not know before part 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/runtime/system.h"

namespace troupe::actors {

// Payload bytes per part: small enough that a relay passes a version on while it still arrives.
inline constexpr std::size_t kRelayPartBytes = 256 * 1024;

struct RelayTarget {
  runtime::ActorId id;
  std::int32_t index = 0;  // the generator's index in the run
  // Where its node listens and its CURVE key, for senders that may not know it ("" = every node
  // of the tree knows it: no member in the tree).
  std::string endpoint, key;
};
struct RelayChild {
  RelayTarget node;
  std::vector<RelayTarget> below;  // its subtree, which it splits in turn
};

// `subtree` split among at most `fanout` children: contiguous runs of near-equal size, the first
// of each run its child, the rest that child's subtree (depth about log_fanout of the size).
std::vector<RelayChild> relay_children(const std::vector<RelayTarget>& subtree, int fanout);
std::vector<RelayTarget> relay_targets(const WeightsPart& p);
// Every target's address from `sys`'s address book (rank 0's knows every node of the job and
// every member): for a tree that holds members.
void address_targets(const runtime::ActorSystem& sys, std::vector<RelayTarget>& targets);
// Connects this node to `t`'s (a no-op for a node it knows, or without an address).
Status connect_target(runtime::ActorSystem& sys, const RelayTarget& t);

// `w` as parts of at most `part_bytes` payload bytes each (at least one part), subtree unset.
std::vector<WeightsPart> weights_parts(const Weights& w, std::size_t part_bytes = kRelayPartBytes);

// A receiver's parts of one version, put back together in order.
class PartAssembly {
 public:
  // Part 0 starts over (a resend from another sender); returns false for a part out of order.
  bool add(const WeightsPart& p);
  bool complete() const { return head_.has_value() && next_ == parts_; }
  std::int64_t version() const { return version_; }
  // The whole message (complete() must hold).
  Weights take();
  const std::string& payload() const { return payload_; }  // the bytes so far
  // Whether `p`'s bytes fit without moving the payload (room for the size part 0's head announces).
  bool fits(const WeightsPart& p) const { return payload_.size() + p.bytes.size() <= payload_.capacity(); }

 private:
  std::optional<Weights> head_;
  std::string payload_;
  std::int64_t version_ = -1;
  std::int32_t next_ = 0, parts_ = 0;
};

class RelayFanout : public std::enable_shared_from_this<RelayFanout> {
 public:
  using Done = std::function<void(runtime::Context&, RelayAck)>;
  // `done` runs once every child's subtree has answered and own() was given (when expected).
  RelayFanout(std::vector<RelayChild> children, int fanout, bool own_expected, Done done);
  // Sends part `p` (subtree fields ignored) to every child; keeps it for a route-around.
  void forward(runtime::Context& ctx, const WeightsPart& p);
  // The sender's own Ack (a relaying generator's), merged first.
  void own(runtime::Context& ctx, std::int32_t index, Ack a);
  std::uint64_t egress_bytes() const { return egress_; }

 private:
  void send_to(runtime::Context& ctx, const RelayChild& c, const WeightsPart& p);
  // Part 0 to a child with an address: connected first; its subtree's addresses and this node's go along.
  void address_part(runtime::Context& ctx, const RelayChild& c, WeightsPart& out);
  void on_reply(runtime::Context& ctx, const RelayChild& c, Result<RelayAck> r);
  void maybe_done(runtime::Context& ctx);
  std::vector<RelayChild> children_;
  int fanout_;
  bool own_expected_, own_given_ = false, finished_ = false;
  Done done_;
  std::vector<WeightsPart> kept_;
  int pending_ = 0, busy_ = 0;
  RelayAck merged_;
  std::uint64_t egress_ = 0;
};

// How a relaying generator takes a version: `apply` the whole message (the Ack); optionally
// `begin` (the message without its payload: true when it applies it while the parts come), then
// `feed` (the payload's first bytes so far, after each part is passed on) until `apply`, or
// `abort` (what was fed undone; the bytes fed).
struct RelayApply {
  std::function<Ack(const Weights&)> apply;
  std::function<bool(const Weights&)> begin;
  std::function<void(const char*, std::size_t)> feed;
  std::function<void(const char*)> abort;
};

// A relaying generator's side: parts put back together and passed on as they come (and applied
// as they come when `take.begin` says so); once the last part is here the message is applied
// (`take.apply` gives the Ack), unless this generator applied that version already (sent again
// around a relay that died), and the subtree's RelayAck answers the last part's request once
// every child answered.
class RelayReceiver {
 public:
  explicit RelayReceiver(RelayApply take) : take_(std::move(take)) {}
  Status on_part(runtime::Context& ctx, const WeightsPart& p);
  void abort();  // a version half streamed in is undone (another message comes first)

 private:
  RelayApply take_;
  bool streaming_ = false;  // take_.begin said yes for the parts being put together
  PartAssembly in_;
  std::shared_ptr<RelayFanout> out_;
  std::shared_ptr<runtime::ReplyTo> reply_;
  std::int64_t applied_version_ = -1;
  Ack applied_ack_;
};

}  // namespace troupe::actors
