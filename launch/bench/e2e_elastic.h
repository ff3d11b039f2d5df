// `troupe bench e2e`'s elastic_join case (e2e_elastic.cpp): steps/s before and after two
// generators join a running async job.
#pragma once

#include "troupe/bench/bench.h"

namespace troupe::bench {

int run_elastic_join(const BenchOptions& opt);

}  // namespace troupe::bench
