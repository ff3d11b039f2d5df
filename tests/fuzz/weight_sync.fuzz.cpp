// Fuzz target: the weight-sync decoder (actors/weight_sync/weight_decoder.cpp), a generator's side.
// The input is one byte choosing the generators' dtype (even: fp32, odd: bf16) and then the cereal
// payload of a Weights message (raw, full or delta: chunk table, zstd frames, sparse gaps,
// checksums). It is applied to a fixed three-tensor model; anything but `applied` must leave the
// values exactly as they were.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/actors/weight_codec.h"
#include "troupe/runtime/envelope.h"

namespace {

using namespace troupe;

// Three tensors, the middle one crossing what a small chunk size would make chunk boundaries.
const std::vector<policy::TensorSpec>& tensors() {
  static const std::vector<policy::TensorSpec> t = {
      {"a.weight", {7, 100}, 0}, {"b.weight", {1000}, 700}, {"c.weight", {3, 100}, 1700}};
  return t;
}
constexpr size_t kValues = 2000;

std::vector<float> initial_values() {
  std::vector<float> v(kValues);
  for (size_t i = 0; i < kValues; ++i) v[i] = actors::round_to_bf16(0.001f * static_cast<float>(i) - 0.5f);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto dtype = (data[0] & 1) != 0 ? actors::WeightDtype::bf16 : actors::WeightDtype::fp32;
  actors::Weights w;
  if (!runtime::decode_payload(reinterpret_cast<const char*>(data) + 1, size - 1, w).ok()) return 0;
  static const std::vector<float> before = initial_values();
  std::vector<float> values = before;
  const auto applied = actors::apply_weights(w, values, tensors(), dtype);
  if (applied.status != actors::WeightsStatus::applied &&
      std::memcmp(values.data(), before.data(), kValues * sizeof(float)) != 0)
    std::abort();  // a refused message changed the weights
  return 0;
}
