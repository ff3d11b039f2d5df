// Seeded random draws as ops: the splitmix64 stream (a fixed algorithm, so results never depend on
// the C++ library), normal initialization of a tensor, and sampling one token from a logits row
// (temperature, top-k, top-p, argmax). CPU specification; the backend table (backend.h) exposes
// the same ops for every device.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::kernels {

// splitmix64: advances the state and returns the next 64 random bits.
inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Uniform in [0, 1) from the top 53 bits of the next draw.
inline double uniform01(uint64_t& s) {
  return static_cast<double>(splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
}

// x (n) = stddev * N(0, 1), Box-Muller with two normals per pair of draws (cos, then sin), drawn
// from *rng in order (the state is advanced by the n values written).                 [assigned]
void fill_normal(float* x, size_t n, double stddev, uint64_t* rng);

// What sample_token draws from.
struct SampleParams {
  float temperature = 1.0f;  // 0 = greedy (argmax; its log-prob is reported at temperature 1)
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
};

// Scratch sample_token needs for a row of V logits (a permutation and the row's probabilities).
size_t sample_scratch_bytes(int V);
// Samples one token from logits (V) under softmax(logits / temperature), truncated to the top_k
// most likely and then to the smallest prefix whose probability reaches top_p (ties go to the
// lower index); one uniform draw from *rng unless greedy. *logprob = log softmax(logits /
// temperature) of the token before truncation. scratch: sample_scratch_bytes(V), 8-byte aligned.
int32_t sample_token(float* logprob, const float* logits, int V, const SampleParams& sp, uint64_t* rng,
                     void* scratch);

}  // namespace troupe::kernels
