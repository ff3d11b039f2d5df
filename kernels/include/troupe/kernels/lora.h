// LoRA's low-rank path beside a frozen linear layer (CPU specification; the backend table's
// lora_forward/lora_backward): y += s * (x A^T) B^T with A (r, C), B (OC, r) in PEFT's layout.
// Invariant: u = x A^T is recomputed in backward, never saved, so the ops need only scratch.
#pragma once

#include <cstddef>

namespace troupe::kernels {

// Floats of scratch lora_forward / lora_backward need for N rows at rank r: u (N, r) and du (N, r).
inline size_t lora_scratch_floats(int N, int r) { return 2 * static_cast<size_t>(N) * static_cast<size_t>(r); }

// out (N, OC) += scale * (inp (N, C) . A^T) . B^T, A (r, C), B (OC, r).                      [+=]
template <class T>
void lora_forward(T* out, const T* inp, const T* A, const T* B, T* scratch, int N, int C, int OC, int r, T scale);
// With u = inp . A^T and du = scale * dout . B:
//   dB (OC, r) += scale * dout^T . u;  dA (r, C) += du^T . inp;  dinp (N, C) += du . A.      [+=]
// dinp may be null (no input gradient). scratch: lora_scratch_floats(N, r).
template <class T>
void lora_backward(T* dinp, T* dA, T* dB, const T* dout, const T* inp, const T* A, const T* B, T* scratch, int N,
                   int C, int OC, int r, T scale);

}  // namespace troupe::kernels
