// `troupe bench envs` case nemo_gym_http (nemo_gym_http.cpp): episodes of a real NeMo Gym resource
// server through the nemo_gym env's HTTP client, vs the in-process arithmetic env.
#pragma once

#include <functional>

#include "troupe/bench/bench.h"

namespace troupe::bench {

// Prints the row (or a skip row when nemo-gym is not installed); returns 0, or 1 on a failure.
// `inproc_eps(n)` runs n in-process episodes and returns episodes/s (the baseline).
int run_nemo_gym_http_case(const BenchOptions& opt, const std::function<double(int)>& inproc_eps);

}  // namespace troupe::bench
