// The CUDA backend's sparse buffers (Backend::alloc_sparse): an address range reserved through the
// driver's virtual memory management, with physical granules mapped into it where and while the
// caller asks (map/unmap), taken from and given back to a pool of unmapped granules, so a layer's
// weights mapped again reuse the memory another layer's gave back (what the backend holds is the
// most ever mapped at once; trim() releases the pool). Plain C++ (the driver calls injected), so the
// host test kernels.cuda_sparse_memory drives its bookkeeping. Invariant: every physical granule
// created and not released is mapped exactly once or sits in the pool; a reserved range is freed
// with nothing mapped in it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::kernels::cuda {

class SparseMemory {
 public:
  struct Driver {
    size_t granularity = 0;                                    // bytes per granule (0: no VMM)
    std::function<uintptr_t(size_t bytes)> reserve;            // addresses only; 0 when refused
    std::function<void(uintptr_t at, size_t bytes)> free_range;
    std::function<uint64_t()> create;                          // one granule of memory; 0 when out of it
    std::function<void(uint64_t handle)> release;
    std::function<std::string(uintptr_t at, uint64_t handle)> map;  // map + access; "" or the error
    std::function<void(uintptr_t at)> unmap;                   // one granule
  };
  explicit SparseMemory(Driver d) : d_(std::move(d)) {}
  SparseMemory(const SparseMemory&) = delete;
  SparseMemory& operator=(const SparseMemory&) = delete;
  ~SparseMemory();

  size_t granularity() const { return d_.granularity; }
  // A range of `bytes` (whole granules reserved), nothing mapped; nullptr when refused.
  void* reserve(size_t bytes);
  bool owns(const void* p) const { return ranges_.count(reinterpret_cast<uintptr_t>(p)) > 0; }
  // Unmaps what is mapped in the range (into the pool) and frees its addresses.
  void free(void* p);
  // [offset, offset + bytes) of the range at p: whole granules (the end may be the range's end).
  // map: an error naming the bytes when the device has no memory left for them (what was mapped
  // before the failure stays mapped); unmap: the granules go to the pool.
  Status map(const void* p, size_t offset, size_t bytes);
  Status unmap(const void* p, size_t offset, size_t bytes);
  std::vector<std::pair<size_t, size_t>> mapped_ranges(const void* p) const;  // byte ranges, merged
  size_t mapped_bytes() const { return mapped_ * d_.granularity; }
  size_t peak_bytes() const { return peak_ * d_.granularity; }
  void reset_peak() { peak_ = mapped_; }
  size_t pooled_bytes() const { return pool_.size() * d_.granularity; }
  void trim();  // releases the pool's granules

 private:
  struct Range {
    size_t bytes;                  // as asked
    std::vector<uint64_t> granule;  // its mapped handle per granule (0: unmapped)
  };
  Result<Range*> checked(const void* p, size_t offset, size_t bytes, const char* what);

  Driver d_;
  std::map<uintptr_t, Range> ranges_;
  std::vector<uint64_t> pool_;
  size_t mapped_ = 0, peak_ = 0;  // granules
};

}  // namespace troupe::kernels::cuda
