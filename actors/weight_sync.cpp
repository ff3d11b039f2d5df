// Weight sync: learner 0's flat parameter arena, tagged with its version, to every generator as a
// Weights message (never through files). Sync mode waits for every generator's Ack (the next
// step samples with the new weights); async mode broadcasts and goes on, the generators take the
// weights after the request they are sampling.
#include "coordinator_internal.h"

namespace troupe::actors::coord {

using runtime::Reply;
using runtime::request;

Task<Status> sync_weights(RunState& s, double* seconds) {
  double t = mono_s();
  auto weights = request<Weights>(s.here, s.peers.learners[0], GetWeightsReq{}, kLongTimeout);
  TROUPE_CO_ASSIGN_OR_RETURN(auto w, co_await weights);
  s.version = w.version;
  std::vector<ActorId> live;  // a generator whose rank died is skipped (rollout.cpp's failover)
  std::vector<size_t> live_index;
  for (size_t g = 0; g < s.peers.generators.size(); ++g)
    if (s.generator_alive(g)) live.push_back(s.peers.generators[g]), live_index.push_back(g);
  if (live.empty()) co_return make_error(ErrorCode::peer_failed, "weight sync: every generator rank is down");
  // A generator whose actor stopped (peer_failed) is dead from then on (rollout.cpp's failover).
  auto mark_down = [&](size_t g) {
    s.generators_down.resize(s.peers.generators.size(), 0);
    s.generators_down[g] = 1;
  };
  if (s.async) {
    if (!s.here->broadcast(std::span<const ActorId>(live), w).ok())  // one is gone: each on its own
      for (size_t i = 0; i < live.size(); ++i)
        if (Status st = s.here->send(live[i], w); !st.ok()) {
          if (st.error().code != ErrorCode::peer_failed) co_return st.error();
          mark_down(live_index[i]);
        }
  } else {
    std::vector<Reply<Ack>> acks;
    for (auto g : live) acks.push_back(request<Ack>(s.here, g, w, kLongTimeout));
    for (size_t i = 0; i < acks.size(); ++i) {
      Result<Ack> a = co_await acks[i];
      if (!a.ok() && a.error().code == ErrorCode::peer_failed) mark_down(live_index[i]);
      if (!a.ok() && s.generator_alive(live_index[i])) co_return a.error();  // (a dead one is skipped)
    }
  }
  if (!s.live_generator_from(0)) co_return make_error(ErrorCode::peer_failed, "weight sync: every generator is down");
  if (seconds) *seconds = mono_s() - t;
  co_return Status{};
}

}  // namespace troupe::actors::coord
