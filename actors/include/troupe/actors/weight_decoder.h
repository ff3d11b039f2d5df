// A generator's side of the weight-sync codec: a full or delta Weights message applied to the
// values it holds, every tensor checked against its checksum. Anything but `applied` leaves the
// values exactly as they were (a delta is undone: XOR is its own inverse).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/actors/weight_format.h"
#include "troupe/policy/model.h"

namespace troupe::actors {

struct WeightsApplied {
  WeightsStatus status = WeightsStatus::applied;
  std::string detail;  // why, when not applied
};
// The receiver's side: applies a full or delta message to `values` (a delta: `values` holds the
// message's base version; the caller checks that it is the one it holds) and checks every
// tensor's checksum. Anything but `applied` leaves `values` as they were.
WeightsApplied apply_weights(const Weights& w, std::span<float> values, const std::vector<policy::TensorSpec>& tensors,
                             WeightDtype dtype);

}  // namespace troupe::actors
