// Weight sync from sharded learners without a join (weights_from_shards, weight_shards.h): each
// learner sends its encoded piece straight to the generators the root sends to, and each of them
// puts the message back together at the pieces' byte offsets. PieceSender is a learner's side (its
// piece as WeightsPiece runs to every target, a few in flight per target when paced);
// PiecesReceiver a generator's (the coordinator's PiecesHead and the learners' runs of one
// transmission assembled in one buffer, passed on down the relay tree as WeightsParts as the
// message's prefix fills, applied once whole, and answered with the subtree's RelayAck).
// Invariants: a generator's assembled message is byte for byte the join of the pieces
// (join_weight_shards), so it applies and checks it as any Weights; transmissions are passed on and
// applied in the order the coordinator numbered them; every generator of a subtree ends up in
// the RelayAck, with its Ack or among the ones found down.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/runtime/system.h"

namespace troupe::actors {

// Payload bytes per WeightsPiece, and how many a paced learner keeps in flight per target.
inline constexpr std::size_t kPieceRunBytes = 256 * 1024;
inline constexpr int kPieceWindow = 8;

// A learner's side: `payloads` (its encoded piece: one payload, or one per run of a piece of several
// runs, each going to its span of req.spans) to every target of `req`, in runs of at most
// kPieceRunBytes. Paced: each run a request, at most kPieceWindow unanswered per target; `done`
// once every target answered every run (or failed: it is named in the reply's detail and sent
// nothing more). Unpaced: every run sent at once, `done` right after.
class PieceSender : public std::enable_shared_from_this<PieceSender> {
 public:
  using Done = std::function<void(runtime::Context&, SendPieceRep)>;
  PieceSender(runtime::Bytes payload, SendPieceReq req, Done done);
  PieceSender(std::vector<runtime::Bytes> payloads, SendPieceReq req, Done done);
  // "" when `payloads` fit req.spans (a pair per payload, of its size; or no spans and one payload),
  // else why not.
  static std::string mismatch(const std::vector<runtime::Bytes>& payloads, const SendPieceReq& req);
  void start(runtime::Context& ctx);

 private:
  struct Target {
    runtime::ActorId id;
    std::size_t next = 0;  // the next run to send
    int in_flight = 0;
    bool failed = false;
  };
  WeightsPiece run(std::size_t k) const;
  void pump(runtime::Context& ctx, std::size_t t);
  void on_ack(runtime::Context& ctx, std::size_t t, Result<Ack> a);
  void maybe_done(runtime::Context& ctx);
  struct Block {  // run k: bytes [from, from + n) of payload p, to byte `at` of the message
    size_t p = 0, from = 0, n = 0;
    std::uint64_t at = 0;
  };
  std::vector<runtime::Bytes> payloads_;
  std::vector<Block> blocks_;
  SendPieceReq req_;
  Done done_;
  std::size_t runs_ = 0;
  std::vector<Target> targets_;
  SendPieceRep rep_;
  int busy_ = 0;  // inside a sending loop (a reply that comes at once only records)
  bool finished_ = false;
};

class RelayFanout;

// A generator's side. `apply` applies a whole message and gives its Ack (as RelayReceiver's).
class PiecesReceiver {
 public:
  using Apply = std::function<Ack(const Weights&)>;
  PiecesReceiver();
  ~PiecesReceiver();
  // The coordinator's head (a request): answered once its transmission is applied and passed on.
  void on_head(runtime::Context& ctx, const PiecesHead& h, const Apply& apply);
  // A learner's run: copied in place (a request is answered with an Ack: applied = copied).
  Status on_piece(runtime::Context& ctx, const WeightsPiece& p, const Apply& apply);
  // Whether a transmission is under way (its head or runs came, it is not applied yet).
  bool assembling() const { return !sends_.empty(); }

 private:
  struct Assembly;
  Assembly& assembly(std::uint64_t send, std::uint64_t total);
  // The oldest transmission's prefix passed on, and while it is complete, applied and answered.
  void advance(runtime::Context& ctx, const Apply& apply);
  std::map<std::uint64_t, std::unique_ptr<Assembly>> sends_;  // by transmission, oldest first
  std::uint64_t finished_below_ = 0;  // transmissions before it are done (a late run of one is dropped)
};

}  // namespace troupe::actors
