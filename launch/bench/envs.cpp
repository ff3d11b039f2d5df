// `troupe bench envs`: see the issue that owns this suite for its cases.
#include <cstdio>

#include "bench.h"

namespace troupe::bench {

int run_envs_suite(const BenchOptions& opt) {
  (void)opt;
  std::fprintf(stderr, "troupe bench envs: this suite is not implemented yet\n");
  return 1;
}

}  // namespace troupe::bench
