// What the CUDA backend's out-of-memory errors say about its stream-ordered pool (cudaMallocAsync
// on the device's default cudaMemPool, kept rather than released between steps): plain C++, so
// the host tests check the wording. Invariant: the report names every figure it was given and
// never claims a figure it could not read (unknown figures are left out).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace troupe::kernels::cuda {

struct PoolFigures {
  std::optional<uint64_t> reserved;  // bytes the pool holds from the device (cudaMemPoolAttrReservedMemCurrent)
  std::optional<uint64_t> used;      // of which live buffers use (cudaMemPoolAttrUsedMemCurrent)
  std::optional<uint64_t> device_free, device_total;  // cudaMemGetInfo
};

inline std::string mib(uint64_t bytes) {
  const uint64_t tenth = (bytes * 10 + (1u << 19)) >> 20;  // MiB to one decimal, rounded
  return std::to_string(tenth / 10) + "." + std::to_string(tenth % 10) + " MiB";
}

// "the pool holds 1024.0 MiB (1000.0 MiB in live buffers, 24.0 MiB cached); the device has 3.0 of
// 80.0 GiB... free" -- the part of an out-of-memory error after the tensor and its size.
inline std::string pool_report(const PoolFigures& f) {
  std::string s;
  if (f.reserved) {
    s = "the memory pool holds " + mib(*f.reserved);
    if (f.used && *f.used <= *f.reserved)
      s += " (" + mib(*f.used) + " in live buffers, " + mib(*f.reserved - *f.used) + " cached for reuse)";
  }
  if (f.device_free && f.device_total)
    s += (s.empty() ? "" : "; ") + std::string("the device has ") + mib(*f.device_free) + " of " +
         mib(*f.device_total) + " free";
  return s;
}

}  // namespace troupe::kernels::cuda
