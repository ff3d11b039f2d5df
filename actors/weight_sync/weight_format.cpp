// The codec's formats (weight_format.h, wire_format.h): dtype and status names, bf16 rounding, the
// chunk plan that cuts an arena into chunks (each tensor's own when the table tiles the arena), and
// the per-thread scratch the encoder and the decoder share. Pure functions of their arguments.
#include "troupe/actors/weight_format.h"

#include <algorithm>

#include "wire_format.h"

namespace troupe::actors {

const char* weights_status_name(WeightsStatus s) {
  switch (s) {
    case WeightsStatus::applied: return "applied";
    case WeightsStatus::checksum_failed: return "checksum_failed";
    case WeightsStatus::refused: return "refused";
    case WeightsStatus::probe_mismatch: return "probe_mismatch";
  }
  return "unknown";
}

float round_to_bf16(float x) { return std::bit_cast<float>(codec::bf16_bits(std::bit_cast<std::uint32_t>(x))); }

void round_to_dtype(std::span<float> values, WeightDtype dtype) {
  if (dtype != WeightDtype::bf16) return;
  const auto n = static_cast<std::ptrdiff_t>(values.size());
  float* v = values.data();
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) v[i] = round_to_bf16(v[i]);
}

namespace codec {

namespace {

// Tensor indices by offset when they tile [0, n) exactly; empty otherwise.
std::vector<size_t> tiling_order(const std::vector<policy::TensorSpec>& tensors, size_t n) {
  std::vector<size_t> order(tensors.size());
  for (size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return tensors[x].offset < tensors[y].offset; });
  size_t at = 0;
  for (size_t t : order) {
    if (tensors[t].offset != at) return {};
    at += tensors[t].numel();
  }
  if (at != n) return {};
  return order;
}

}  // namespace

std::vector<ChunkPlan::Unit> units_of(const std::vector<policy::TensorSpec>& tensors, const std::vector<size_t>& start,
                                      size_t n) {
  const auto order = tiling_order(tensors, n);
  if (order.empty() && n > 0) return {};
  std::vector<ChunkPlan::Unit> units;
  size_t c = 0;
  const size_t chunks = start.size() - 1;
  for (size_t t : order) {
    const size_t lo = tensors[t].offset, hi = lo + tensors[t].numel();
    if (hi == lo) continue;
    if (c >= chunks || start[c] != lo) return {};
    const size_t first = c;
    while (c < chunks && start[c + 1] <= hi) ++c;
    if (start[c] != hi) return {};  // a chunk crosses the tensor's end
    units.push_back({t, first, c});
  }
  std::stable_sort(units.begin(), units.end(),
                   [&](const auto& x, const auto& y) { return start[x.last] - start[x.first] > start[y.last] - start[y.first]; });
  return units;
}

ChunkPlan plan_chunks(const std::vector<policy::TensorSpec>& tensors, size_t n, size_t C) {
  ChunkPlan plan;
  const auto order = tiling_order(tensors, n);
  if (!order.empty()) {
    for (size_t t : order)
      for (size_t a = 0, len = tensors[t].numel(); a < len; a += C) plan.start.push_back(tensors[t].offset + a);
  } else {
    for (size_t a = 0; a < n; a += C) plan.start.push_back(a);
  }
  plan.start.push_back(n);
  if (!order.empty()) plan.units = units_of(tensors, plan.start, n);
  return plan;
}

ThreadScratch& thread_scratch() {
  thread_local ThreadScratch s;
  return s;
}

}  // namespace codec
}  // namespace troupe::actors
