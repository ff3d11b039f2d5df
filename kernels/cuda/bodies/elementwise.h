// Kernel bodies of the elementwise family (swiglu.cu): fills, the residual add, SwiGLU, the bias of
// a linear layer and the per-row sigmoid gate, each the per-element (or per-row) step of its CPU
// op in ops.h with the same arithmetic in the same order.
#pragma once

#include "lanes.h"
#include "troupe/kernels/lora.h"

namespace troupe::kernels::cuda {

struct FillBody {
  float* x;
  float value;
  TROUPE_HD void operator()(size_t i) const { x[i] = value; }
};

struct ScaleBody {  // x = float(double(x) * s): Backend::scale, the host loop's rounding
  float* x;
  double s;
  TROUPE_HD void operator()(size_t i) const { x[i] = static_cast<float>(static_cast<double>(x[i]) * s); }
};

struct AddBody {  // out = a + b (may alias)
  float* out;
  const float* a;
  const float* b;
  TROUPE_HD void operator()(size_t i) const { out[i] = a[i] + b[i]; }
};

struct LoraDropoutBody {  // out = in * mask / (1 - p), lora.h's mask (may alias)
  float* out;
  const float* in;
  float p, keep_scale;
  uint64_t seed;
  TROUPE_HD void operator()(size_t i) const { out[i] = lora_dropout_keep(seed, i, p) ? in[i] * keep_scale : 0.0f; }
};

struct SwigluForwardBody {
  float* out;
  const float* gate;
  const float* up;
  TROUPE_HD void operator()(size_t i) const {
    const float g = gate[i];
    out[i] = g / (1.0f + hd_exp(-g)) * up[i];
  }
};

struct SwigluBackwardBody {
  float* dgate;
  float* dup;
  const float* dout;
  const float* gate;
  const float* up;
  TROUPE_HD void operator()(size_t i) const {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + hd_exp(-g));
    const float silu = g * sig;
    dgate[i] = dout[i] * up[i] * (sig + silu * (1.0f - sig));
    dup[i] = dout[i] * silu;
  }
};

struct BiasForwardBody {  // out (N, OC) += bias, over N*OC elements
  float* out;
  const float* bias;
  int OC;
  TROUPE_HD void operator()(size_t i) const { out[i] += bias[i % static_cast<size_t>(OC)]; }
};

struct BiasBackwardBody {  // one thread per column o: dbias[o] += sum over rows in row order
  float* dbias;
  const float* dout;
  int N, OC;
  TROUPE_HD void operator()(size_t o) const {
    float s = 0;
    for (int n = 0; n < N; ++n) s += dout[static_cast<size_t>(n) * OC + o];
    dbias[o] += s;
  }
};

struct SigmoidGateForwardBody {  // over N*C elements
  float* out;
  const float* gate;
  const float* x;
  int C;
  TROUPE_HD void operator()(size_t i) const {
    const float sig = 1.0f / (1.0f + hd_exp(-gate[i / static_cast<size_t>(C)]));
    out[i] = sig * x[i];
  }
};

struct SigmoidGateBackwardBody {  // one row per token
  float* dgate;
  float* dx;
  const float* dout;
  const float* gate;
  const float* x;
  int C;
  template <class Lanes>
  TROUPE_HD void row(const Lanes& L, int n) const {
    const float sig = 1.0f / (1.0f + hd_exp(-gate[n]));
    const size_t r = static_cast<size_t>(n) * C;
    float dot = 0;
    for (int c = L.lane(); c < C; c += L.count()) {
      dot += dout[r + c] * x[r + c];
      dx[r + c] = sig * dout[r + c];
    }
    dot = L.sum(dot);
    if (L.lane() == 0) dgate[n] = sig * (1.0f - sig) * dot;
  }
};

}  // namespace troupe::kernels::cuda
