// The coordinator's weight sync: learner 0's weights (or, weights_from_shards, every learner's piece,
// sent by the learners themselves) to every live generator through the run's WeightSync (troupe/actors/weight_sync.h), which
// the first sync makes; the generators the sync finds dead are marked down, and s.version becomes
// the version they now hold. Members that joined are admitted just before a sync and leaves
// answered just after it (membership.cpp).
#include <memory>

#include "coordinator_internal.h"
#include "troupe/actors/weight_shards.h"

namespace troupe::actors::coord {

Task<Status> sync_weights(RunState& s, double* seconds) {
  const bool from_shards = weights_from_shards(s.cfg);
  if (!s.weight_sync) {
    s.weight_sync = std::make_unique<WeightSync>(s.cfg.weight_sync, s.cfg.rollout.async);
    if (from_shards && s.hooks.log && learners_divide_experts(s.cfg))
      s.hooks.log("weight sync: from the expert blocks of " + std::to_string(s.cfg.policy.expert_parallel) +
                  " learners (each of the first expert-parallel group encodes its experts and 1/" +
                  std::to_string(s.cfg.policy.expert_parallel) + " of the rest and sends them to the generators)");
    else if (from_shards && s.hooks.log)
      s.hooks.log("weight sync: from the shards of " + std::to_string(s.peers.learners.size()) +
                  " learners (each encodes its own and sends it to the generators)");
  }
  admit_members(s);  // joiners get the full weights by this sync
  WeightSyncPeers peers;
  peers.learner = s.peers.learners[0];
  // each learner encodes its shard (divided experts: the first group's their runs; all are asked)
  if (from_shards) peers.shard_learners = s.peers.learners;
  peers.generators = s.peers.generators;
  peers.alive = [&s](size_t g) { return s.generator_alive(g); };
  peers.mark_down = [&s](size_t g) { s.mark_generator_down(g); };
  peers.log = s.hooks.log;
  // a member relays when the job's nodes can reach it (membership.cpp), else only rank 0 sends to it
  peers.joined = [&s](size_t g) { return s.membership.joined(g); };
  peers.root_only = [&s](size_t g) {
    const MemberRecord* m = s.membership.generator(g);
    return m && !m->relays;
  };
  TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await s.weight_sync->sync(s.here, peers));
  settle_members(s, rep.version);
  if (from_shards && s.hooks.log)  // what rank 0 sent: learner 0's piece only (the heads aside)
    s.hooks.log("weight sync: version " + std::to_string(rep.version) + " in " + std::to_string(rep.pieces) +
                " pieces (a delta to " + std::to_string(rep.delta) + " generators, in full to " +
                std::to_string(rep.full) + "): rank 0 sent " + std::to_string(rep.bytes_sent) + " of the learners' " +
                std::to_string(rep.learner_bytes) + " payload bytes");
  if (!s.live_generator_from(0)) co_return make_error(ErrorCode::peer_failed, "weight sync: every generator is down");
  s.version = rep.version;
  if (seconds) *seconds = rep.seconds;
  co_return Status{};
}

}  // namespace troupe::actors::coord
