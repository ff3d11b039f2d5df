// The weight-sync codec's formats: the generators' dtypes (fp32: the master as is; bf16: each
// value rounded to the nearest bf16, ties to even, kept as an fp32 whose low 16 bits are zero), a
// Weights message's encodings, what a generator answers in its Ack, and the per-tensor xxh3-64
// checksums every payload carries (of the values as the receiver must hold them).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "troupe/actors/weight_dtype.h"
#include "troupe/policy/model.h"

namespace troupe::actors {

// device: no payload; the values go over the weight group's broadcast (weight_group.h), the
// message carries their checksums (and the probe) as a full one would.
enum class WeightEncoding : std::int32_t { raw = 0, full = 1, delta = 2, device = 3 };
// Ack::status: what a generator did with a Weights message.
enum class WeightsStatus : std::int32_t {
  applied = 0,
  checksum_failed = 1,  // the payload did not decode to the checksums (corrupt): it keeps its weights
  refused = 2,          // not for it (a delta against a version it does not hold, another dtype or shape)
  probe_mismatch = 3,   // applied, but its probe log-probs differ from learner 0's
};

// WeightDtype's names (fp32 | bf16) are in weight_dtype.h: enum_name / enum_from_name.
const char* weights_status_name(WeightsStatus s);

// x rounded to the nearest bf16 (ties to even), as an fp32; NaN stays a (quiet) NaN, infinities stay.
float round_to_bf16(float x);
// Every value of `values` in `dtype` (bf16: rounded in place; fp32: unchanged).
void round_to_dtype(std::span<float> values, WeightDtype dtype);

// Per tensor of `tensors`: the xxh3-64 of its values in wire form (fp32: their bytes; bf16: the
// high halves of their bits, two bytes each), what Weights::checksums holds.
std::vector<std::uint64_t> weight_checksums(std::span<const float> values,
                                            const std::vector<policy::TensorSpec>& tensors, WeightDtype dtype);

// Values per chunk of a payload (a delta's chunks, which follow the tensors, may be shorter): a
// chunk is the unit that is compressed (and decoded) on one thread.
inline constexpr std::uint32_t kWeightChunkElements = 1u << 20;

}  // namespace troupe::actors
