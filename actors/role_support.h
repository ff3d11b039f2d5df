// Helpers the role implementations share (not part of the actors API): wall-clock seconds for the
// timing fields of replies, and OpenMP's per-thread thread count.
#pragma once

#include <omp.h>

#include <chrono>

namespace troupe::actors {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// OpenMP's nthreads is a per-thread setting: set it on the worker thread that runs the handler.
inline void use_threads(int n) {
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}

}  // namespace troupe::actors
