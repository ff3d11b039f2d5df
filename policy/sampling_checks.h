// The checks of sampling parameters that Model::generate (generate.cpp) and DecodeSlots::add
// (decode_slots.cpp) share, with their error messages. Not a public header.
// Invariant: an accepted (temperature, top_k, top_p) is one every sampler kernel takes.
#pragma once

#include <cmath>
#include <string>

#include "troupe/base/result.h"

namespace troupe::policy {

inline Status check_sampling(float temperature, int top_k, float top_p) {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return invalid_input("sampling: temperature must be >= 0, got " + std::to_string(temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return invalid_input("sampling: top_p must be in (0, 1], got " + std::to_string(top_p));
  if (top_k < 0) return invalid_input("sampling: top_k must be >= 0, got " + std::to_string(top_k));
  return {};
}

}  // namespace troupe::policy
