// The simulated roles of scale_sim.h (internal to the bench library): an env worker, a generator and a
// learner that answer the coordinator's messages after a delay from SimTiming instead of doing
// the work, and the world they share (the manual clock's pending replies, learner 0's link, the
// CPU time their handlers took, the staleness of trained samples).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <utility>
#include <vector>

#include "troupe/bench/scale_sim.h"
#include "troupe/base/clock.h"
#include "troupe/runtime/system.h"

namespace troupe::bench::sim {

struct SimWorld {
  ScaleSimConfig cfg;
  // When the pending simulated replies fall due (the driver advances the manual clock to the
  // earliest); each is also a timer of its actor, which sends the reply.
  std::priority_queue<runtime::Clock::time_point, std::vector<runtime::Clock::time_point>, std::greater<>> due;
  runtime::Clock::time_point link_free{};  // learner 0's link (rank 0's): busy until then
  // weight_sync.relay_fanout: when a relayed copy's bytes start and finish arriving at a generator
  // (packed ActorId), set by its parent as it sends (SimGenerator::relay)
  std::map<std::uint64_t, std::pair<runtime::Clock::time_point, runtime::Clock::time_point>> relay_window;
  double roles_s = 0;  // time in the simulated roles' handlers (they run on the driver's thread)
  std::int64_t messages = 0;
  std::map<std::int64_t, std::int64_t> staleness;

  // The time `bytes` leave learner 0's link when they are queued on it now.
  runtime::Clock::time_point send_on_link(runtime::Clock::time_point now, double bytes);
};

// Adds the time of its scope to SimWorld::roles_s (the monotonic clock: a thread's CPU clock is a
// system call, too dear for thousands of handlers per step).
class RoleCpu {
 public:
  explicit RoleCpu(SimWorld& w) : w_(w), t0_(mono_seconds()) {}
  ~RoleCpu() { w_.roles_s += mono_seconds() - t0_; }
  RoleCpu(const RoleCpu&) = delete;
  RoleCpu& operator=(const RoleCpu&) = delete;

 private:
  SimWorld& w_;
  double t0_;
};

// The three roles. An env worker's index seeds its latency draws; learner 0 (index 0) records the
// staleness of what it trains. A generator's draws come from each request's sampling seed.
std::unique_ptr<runtime::Actor> make_sim_env(SimWorld& w, int index);
std::unique_ptr<runtime::Actor> make_sim_generator(SimWorld& w);
std::unique_ptr<runtime::Actor> make_sim_learner(SimWorld& w, int index);

}  // namespace troupe::bench::sim
