// LoRA's low-rank path beside a frozen linear layer (CPU specification; the backend table's
// lora_forward/lora_backward): y += s * (x A^T) B^T with A (r, C), B (OC, r) in PEFT's layout.
// Invariant: u = x A^T is recomputed in backward, never saved, so the ops need only scratch.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define TROUPE_LORA_HD __host__ __device__
#else
#define TROUPE_LORA_HD
#endif

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

// LoRA dropout's mask (PEFT's lora_dropout on the low-rank path's input): element i of the mask
// drawn with `seed` keeps its value iff the top 24 bits of splitmix64(seed + (i + 1) * golden), as a
// uniform in [0, 1), are >= p. Counter-based, so a mask depends on (seed, i) alone: not on threads,
// on the backend or on how often it is drawn (backward and a recompute draw the same mask).
TROUPE_LORA_HD inline bool lora_dropout_keep(uint64_t seed, size_t i, float p) {
  uint64_t z = seed + (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f) >= p;
}

// out (n) = in (n) * mask / (1 - p), the mask lora_dropout_keep(seed, i, p); out may alias in.
void lora_dropout(float* out, const float* in, size_t n, float p, uint64_t seed);

}  // namespace troupe::kernels
