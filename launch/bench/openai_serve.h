// `troupe bench envs` case openai_serve_concurrent64 (openai_serve.cpp): 64 chat requests at once
// against `troupe serve`'s endpoint, in process, vs the same 64 one at a time.
#pragma once

#include "troupe/bench/bench.h"

namespace troupe::bench {

// Prints the row; returns 0, or 1 when the server or a request failed (said on stderr).
int run_openai_serve_case(const BenchOptions& opt);

}  // namespace troupe::bench
