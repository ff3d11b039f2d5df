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
  if (s.async) {
    TROUPE_CO_TRY(s.here->broadcast(std::span<const ActorId>(s.peers.generators), w));
  } else {
    std::vector<Reply<Ack>> acks;
    for (auto g : s.peers.generators) acks.push_back(request<Ack>(s.here, g, w, kLongTimeout));
    for (auto& a : acks) TROUPE_CO_TRY(co_await a);
  }
  if (seconds) *seconds = mono_s() - t;
  co_return Status{};
}

}  // namespace troupe::actors::coord
