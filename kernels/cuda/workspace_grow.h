// Growing a device workspace (the CUDA backend's scratch) without CUDA in sight, so the host tests
// can inject a failing allocator. Invariant: after a call, (data, bytes) describe what is really
// allocated: a failed grow leaves a null workspace of 0 bytes (never a null one claiming a size).
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <string>

#include "troupe/base/result.h"

namespace troupe::kernels::cuda {

// How a workspace gets its memory: alloc throws (or returns nullptr) on failure; release frees.
struct WorkspaceMemory {
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> release;
};

// Grows (data, bytes) to at least `need` bytes; the old block is released first (its contents are
// not kept, and the peak stays one block). On failure the workspace is empty and usable again, and
// the error names the workspace, the bytes asked for and what was allocated before.
inline Status grow_workspace(const char* name, void*& data, size_t& bytes, size_t need,
                             const WorkspaceMemory& mem) {
  if (need <= bytes && (data != nullptr || need == 0)) return {};
  const size_t had = bytes;
  if (data) mem.release(data);
  data = nullptr;
  bytes = 0;
  std::string why = "the allocator returned no memory";
  try {
    data = mem.alloc(need);
  } catch (const std::exception& e) {
    data = nullptr;
    why = e.what();
  }
  if (!data)
    return make_error(ErrorCode::internal, std::string("cuda backend: growing the workspace '") + name +
                                               "' to " + std::to_string(need) + " bytes failed (it held " +
                                               std::to_string(had) + " bytes, now 0 are allocated): " + why);
  bytes = need;
  return {};
}

}  // namespace troupe::kernels::cuda
