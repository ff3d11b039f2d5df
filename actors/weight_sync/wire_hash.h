// The checksums' hashing (internal to actors/weight_sync/): xxh3-64 of values in wire form (fp32
// as they are, bf16 their high halves), a tensor at a time. Every path that checksums (the
// encoder, a full payload, the decoder's fused pass) hashes the same bytes, so their sums agree.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "troupe/policy/model.h"
#include "wire_format.h"

namespace troupe::actors::codec {

// Hashes n values in wire form (W bytes each: fp32 as they are, bf16 their high halves, packed in
// blocks that stay in L1, so memory is read once) into st.
[[gnu::always_inline]] inline void hash_values(XXH3_state_t* st, const float* v, size_t n, size_t W) {
  if (W == 4) {
    XXH3_64bits_update(st, v, n * 4);
    return;
  }
  std::uint16_t packed[kHashBlock];
  for (size_t a = 0; a < n; a += kHashBlock) {
    const size_t len = std::min(kHashBlock, n - a);
#pragma omp simd
    for (size_t i = 0; i < len; ++i) packed[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v[a + i]) >> 16);
    XXH3_64bits_update(st, packed, len * 2);
  }
}

// The per-tensor checksums straight from a full payload (the values' wire bytes, element after element).
std::vector<std::uint64_t> payload_checksums(const std::uint8_t* payload, size_t W,
                                             const std::vector<policy::TensorSpec>& tensors);

// The checksum of a tensor of no values (it is in no unit of a chunk plan).
inline std::uint64_t empty_checksum() { return XXH3_64bits(nullptr, 0); }

}  // namespace troupe::actors::codec
