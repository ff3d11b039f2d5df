// Per-tensor checksums (weight_format.h's weight_checksums, wire_hash.h): xxh3-64 of each tensor's
// values in wire form, from float values or from a full payload's bytes; the tensors hash in
// parallel (OpenMP), each on one thread, so a sum never depends on the thread count.
#include "wire_hash.h"

#include "troupe/actors/weight_format.h"

namespace troupe::actors {

namespace codec {

namespace {

std::uint64_t wire_hash(const float* v, size_t n, WeightDtype dtype) {
  if (dtype != WeightDtype::bf16) return XXH3_64bits(v, n * sizeof(float));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  hash_values(st, v, n, 2);
  const std::uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace

std::vector<std::uint64_t> payload_checksums(const std::uint8_t* payload, size_t W,
                                             const std::vector<policy::TensorSpec>& tensors) {
  std::vector<std::uint64_t> out(tensors.size(), 0);
  const auto n = static_cast<std::ptrdiff_t>(tensors.size());
#pragma omp parallel for schedule(dynamic)
  for (std::ptrdiff_t t = 0; t < n; ++t) {
    const auto& s = tensors[static_cast<size_t>(t)];
    out[static_cast<size_t>(t)] = XXH3_64bits(payload + s.offset * W, s.numel() * W);
  }
  return out;
}

}  // namespace codec

std::vector<std::uint64_t> weight_checksums(std::span<const float> values,
                                            const std::vector<policy::TensorSpec>& tensors, WeightDtype dtype) {
  std::vector<std::uint64_t> out(tensors.size(), 0);
  const auto n = static_cast<std::ptrdiff_t>(tensors.size());
#pragma omp parallel for schedule(dynamic)
  for (std::ptrdiff_t t = 0; t < n; ++t) {
    const auto& s = tensors[static_cast<size_t>(t)];
    if (s.offset + s.numel() > values.size()) continue;  // (the caller checked the table against the arena)
    out[static_cast<size_t>(t)] = codec::wire_hash(values.data() + s.offset, s.numel(), dtype);
  }
  return out;
}

}  // namespace troupe::actors
