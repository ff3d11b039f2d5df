// Helpers the role implementations share (not part of the actors API): wall-clock seconds for the
// timing fields of replies, OpenMP's per-thread thread count, and the death an injected fault asks for.
#pragma once

#include <omp.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "troupe/base/clock.h"  // seconds_since, for the timing fields of replies

namespace troupe::actors {

// OpenMP's nthreads is a per-thread setting: set it on the worker thread that runs the handler.
inline void use_threads(int n) {
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}

// An injected fault (the faults: section) that kills this process the way SIGKILL from outside would.
[[noreturn]] inline void die_by_fault(const std::string& what) {
  std::fprintf(stderr, "troupe: fault injected: %s\n", what.c_str());
  std::fflush(stderr);
  ::raise(SIGKILL);
  std::abort();
}

}  // namespace troupe::actors
