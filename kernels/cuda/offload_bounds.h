// The size check of the GPU activation offload (activation_reload.h), without CUDA in sight so the
// host tests call it. Invariant: an offload copies the whole input or fails; it never truncates.
#pragma once

#include <cstddef>
#include <string>

#include "troupe/base/result.h"

namespace troupe::kernels::cuda {

// The floats layer's offload copies: n, or the whole slot when n is the default (size_t(-1)); an
// input larger than the slot is an error naming the layer and both sizes.
inline Result<size_t> offload_floats(int layer, size_t n, size_t slot_floats) {
  if (n == static_cast<size_t>(-1)) return slot_floats;
  if (n > slot_floats)
    return invalid_input("activation offload: layer " + std::to_string(layer) + "'s input is " +
                         std::to_string(n) + " floats, more than its slot of " + std::to_string(slot_floats) +
                         " floats (OffloadOptions::max_floats): nothing was copied");
  return n;
}

}  // namespace troupe::kernels::cuda
