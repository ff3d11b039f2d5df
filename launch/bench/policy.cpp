// `troupe bench policy`: see the issue that owns this suite for its cases.
#include <cstdio>

#include "bench.h"

namespace troupe::bench {

int run_policy_suite(const BenchOptions& opt) {
  (void)opt;
  std::fprintf(stderr, "troupe bench policy: this suite is not implemented yet\n");
  return 1;
}

}  // namespace troupe::bench
