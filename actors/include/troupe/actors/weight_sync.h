// The coordinator's side of weight sync (docs/weight_sync.md): after an update, learner 0's
// weights go to every live generator as Weights messages (a delta to each generator known to hold
// the version learner 0 encoded last, the full weights to the others) and every generator answers
// with an Ack. A generator is sent the full weights at the start, when it joins (nothing
// acknowledged yet), after its Ack reported a checksum failure or a refused delta, and on every
// weight_sync.full_every-th version. Sync mode awaits every Ack (a generator that failed the
// checksum is sent the full weights at once, before the next step samples); async mode sends and
// goes on, and each Ack updates what the generator is known to hold when it arrives. A probe
// mismatch is an error naming the generator, the version and the first differing position.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/experiment_config.h"
#include "troupe/base/result.h"
#include "troupe/runtime/coroutine.h"

namespace troupe::actors {

// Who a sync involves: learner 0 (it encodes), the generators, whether each is alive, a log.
struct WeightSyncPeers {
  runtime::ActorId learner;
  // weights_from_shards (weight_shards.h): every learner, in rank order; each encodes its shard's
  // piece and sends it straight to the generators the root sends to (weight_pieces.h), which put
  // the message together; the coordinator only joins the pieces' heads. Empty: learner 0 alone
  // encodes the whole weights.
  std::vector<runtime::ActorId> shard_learners;
  std::vector<runtime::ActorId> generators;
  std::function<bool(size_t)> alive;              // null = every generator is
  // A generator whose Weights request failed as peer_failed (its actor stopped): dead from then on.
  std::function<void(size_t)> mark_down;          // null = nothing to tell
  std::function<void(const std::string&)> log;    // null = quiet
  // A generator reachable from learner 0's node only (a member that joined the running job whose
  // address the job's other nodes cannot reach): the relay tree sends to it from the root and
  // never through it. null = none is.
  std::function<bool(size_t)> root_only;
  // A member that joined the running job and relays like any generator: its node knows rank 0's
  // only, so a tree that holds one carries every node's address (weight_relay.h). null = none is.
  std::function<bool(size_t)> joined;
};

// What one sync did.
struct WeightSyncReport {
  std::int64_t version = 0;   // learner 0's, now the generators'
  int full = 0, delta = 0;    // generators sent the full weights / a delta (retries included)
  int resent = 0;             // sync mode: generators sent the full weights again after a failed Ack
  int broadcast = 0;          // weight_sync.transport nccl: generators that took the values by broadcast
  std::uint64_t bytes_sent = 0;     // Weights payload bytes (over ZeroMQ) learner 0's rank sent, summed over the generators sent to
  std::uint64_t learner_bytes = 0;  // weights_from_shards: payload bytes every learner sent (learner 0's in bytes_sent)
  int pieces = 0;                   // weights_from_shards: the learners whose pieces make each message
  std::uint64_t relayed_bytes = 0;  // relay tree (sync mode): payload bytes the generators passed on
  std::uint64_t delta_bytes = 0;    // the delta's payload (0 when none was sent)
  std::uint64_t full_bytes = 0;     // the full payload (0 when none was sent)
  std::uint64_t elements = 0;       // values in the arena
  std::uint64_t changed = 0;        // delta: values that differ from its base (0 without a delta)
  double seconds = 0;
};

class WeightSync {
 public:
  WeightSync(WeightSyncSection cfg, bool async);
  ~WeightSync();
  WeightSync(WeightSync&&) noexcept;
  WeightSync& operator=(WeightSync&&) noexcept;

  // Learner 0's current weights to every live generator (see the file comment). Runs on the
  // actor `here` belongs to; `peers` must outlive the returned task.
  runtime::Task<Result<WeightSyncReport>> sync(runtime::ActorContext& here, const WeightSyncPeers& peers);
  // The version generator g is known to hold (its last Ack), -1 before any.
  std::int64_t held(size_t g) const;

  struct State;  // what each generator holds and was sent (weight_sync.cpp)

 private:
  std::shared_ptr<State> st_;
};

}  // namespace troupe::actors
