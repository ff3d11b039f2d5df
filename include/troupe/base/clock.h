// The one monotonic clock troupe times things with (steady_clock, never wall time): seconds as a
// double for metrics and timeouts, nanoseconds as an integer where a deadline is compared often.
#pragma once

#include <chrono>
#include <cstdint>

namespace troupe {

using MonoClock = std::chrono::steady_clock;

// Seconds since an arbitrary fixed point (only differences mean anything).
inline double mono_seconds() {
  return std::chrono::duration<double>(MonoClock::now().time_since_epoch()).count();
}

// Nanoseconds since the same point, for hot paths that compare deadlines.
inline std::int64_t mono_nanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(MonoClock::now().time_since_epoch()).count();
}

// Seconds elapsed since t0.
inline double seconds_since(MonoClock::time_point t0) {
  return std::chrono::duration<double>(MonoClock::now() - t0).count();
}

}  // namespace troupe
