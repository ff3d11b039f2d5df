// How the NCCL communicator waits without hanging: joining (a non-blocking ncclCommInitRankConfig)
// and each collective are polled (ncclCommGetAsyncError, the collective's completion event) until
// done, failed or past a deadline; a failure or a missed deadline aborts the communicator
// (ncclCommAbort) and is an error naming the rank, the operation and the time waited. Plain C++
// (the poll, the clock and the sleep injected), so the host tests drive the decisions. Invariant:
// the wait returns only done, or an error; never a silent hang past the deadline.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <string>

#include "troupe/base/result.h"

namespace troupe::kernels::cuda {

// One poll of an NCCL operation.
struct NcclPoll {
  enum class State { done, pending, failed };
  State state = State::pending;
  std::string error;  // failed: NCCL's error string (ncclGetErrorString / ncclGetLastError)
};

// The deadline of a join or a collective: TROUPE_NCCL_TIMEOUT_S (seconds, > 0) when set, else
// 600 s. A malformed value is an error naming the variable and the value.
inline Result<double> nccl_timeout_s(const char* env) {
  if (!env || !*env) return 600.0;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(env, &end);
  if (errno != 0 || end == env || *end != '\0' || !(v > 0) || v > 1e7)
    return invalid_input(std::string("TROUPE_NCCL_TIMEOUT_S='") + env +
                         "': expected a number of seconds > 0 (the NCCL join and collective deadline)");
  return v;
}

// Waits for `what` on rank `rank` of `nranks`: poll() until done; failed, or pending at the
// deadline, calls abort() and returns an error naming the rank and the operation. now() is in
// seconds; sleep(s) waits between polls (the poll interval grows from 1 ms to 100 ms).
template <class Poll, class Now, class Sleep, class Abort>
Status nccl_wait(const std::string& what, int rank, int nranks, double timeout_s, Poll poll, Now now, Sleep sleep,
                 Abort abort) {
  const double t0 = now();
  double interval = 0.001;
  for (;;) {
    const NcclPoll p = poll();
    if (p.state == NcclPoll::State::done) return {};
    const double waited = now() - t0;
    const std::string who = "NCCL rank " + std::to_string(rank) + " of " + std::to_string(nranks) + ": " + what;
    if (p.state == NcclPoll::State::failed) {
      abort();
      return make_error(ErrorCode::internal, who + " failed after " + std::to_string(waited) + " s: " + p.error +
                                                 " (the communicator is aborted; a peer rank may have died)");
    }
    if (waited >= timeout_s) {
      abort();
      return make_error(ErrorCode::internal,
                        who + " did not finish within " + std::to_string(timeout_s) +
                            " s (TROUPE_NCCL_TIMEOUT_S): a peer rank is dead, stuck or never joined; the "
                            "communicator is aborted");
    }
    sleep(interval);
    interval = interval * 2 < 0.1 ? interval * 2 : 0.1;
  }
}

}  // namespace troupe::kernels::cuda
