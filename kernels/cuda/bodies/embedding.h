// Kernel bodies of the embedding family (embedding.cu). The backward gives every channel one
// thread that walks the tokens in order, so repeated tokens add in the CPU op's order with no
// atomics (one writer per output element, deterministic).
#pragma once

#include "lanes.h"

namespace troupe::kernels::cuda {

struct EmbeddingForwardBody {  // over N*C elements
  float* out;
  const int32_t* tokens;
  const float* wte;
  int C;
  TROUPE_HD void operator()(size_t i) const {
    const size_t n = i / static_cast<size_t>(C), c = i % static_cast<size_t>(C);
    out[i] = wte[static_cast<size_t>(tokens[n]) * C + c];
  }
};

struct EmbeddingBackwardBody {  // over C channels
  float* dwte;
  const float* dout;
  const int32_t* tokens;
  int N, C;
  TROUPE_HD void operator()(size_t c) const {
    for (int n = 0; n < N; ++n) dwte[static_cast<size_t>(tokens[n]) * C + c] += dout[static_cast<size_t>(n) * C + c];
  }
};

}  // namespace troupe::kernels::cuda
