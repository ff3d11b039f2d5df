// `troupe bench reliability` case serve_overload (reliability_serve.cpp): `troupe serve`'s endpoint
// under more requests than it admits, and requests with a wrong API key.
#pragma once

#include "troupe/bench/bench.h"

namespace troupe::bench {

// Prints the row; returns 0, or 1 when the server failed or a request got an answer it should not.
int run_serve_overload_case(const BenchOptions& opt);

}  // namespace troupe::bench
