// The quantized-weight rows of `troupe bench kernels` (quant_gemv.cpp): SmolLM2-shaped decode
// matvecs with Q4_1 weights dequantized on the fly against the fp32 matvec.
#pragma once

#include "troupe/bench/bench.h"

namespace troupe::bench {

void quant_gemv_cases(const BenchOptions& opt, int reps);

}  // namespace troupe::bench
