// SparseMemory (sparse_memory.h): the bookkeeping of the CUDA backend's sparse buffers.
#include "sparse_memory.h"

#include <algorithm>

#include "troupe/kernels/sparse_ranges.h"

namespace troupe::kernels::cuda {

SparseMemory::~SparseMemory() {
  while (!ranges_.empty()) free(reinterpret_cast<void*>(ranges_.begin()->first));
  trim();
}

void* SparseMemory::reserve(size_t bytes) {
  if (d_.granularity == 0 || bytes == 0) return nullptr;
  const size_t granules = (bytes + d_.granularity - 1) / d_.granularity;
  const uintptr_t at = d_.reserve(granules * d_.granularity);
  if (at == 0) return nullptr;
  ranges_.emplace(at, Range{bytes, std::vector<uint64_t>(granules, 0)});
  return reinterpret_cast<void*>(at);
}

void SparseMemory::free(void* p) {
  const auto it = ranges_.find(reinterpret_cast<uintptr_t>(p));
  if (it == ranges_.end()) return;
  (void)unmap(p, 0, it->second.bytes);
  d_.free_range(it->first, it->second.granule.size() * d_.granularity);
  ranges_.erase(it);
}

Result<SparseMemory::Range*> SparseMemory::checked(const void* p, size_t offset, size_t bytes, const char* what) {
  const auto it = ranges_.find(reinterpret_cast<uintptr_t>(p));
  if (it == ranges_.end())
    return make_error(ErrorCode::internal, std::string("cuda backend: ") + what + " of a buffer that is not sparse");
  const size_t end = offset + bytes, g = d_.granularity;
  if (offset % g != 0 || (end % g != 0 && end != it->second.bytes) || end > it->second.bytes)
    return make_error(ErrorCode::internal, std::string("cuda backend: ") + what + " of bytes [" + std::to_string(offset) +
                                               ", " + std::to_string(end) + ") of a sparse buffer of " +
                                               std::to_string(it->second.bytes) + ": not whole granules of " +
                                               std::to_string(g) + " inside it");
  return &it->second;
}

Status SparseMemory::map(const void* p, size_t offset, size_t bytes) {
  TROUPE_ASSIGN_OR_RETURN(Range* r, checked(p, offset, bytes, "map_sparse"));
  const size_t g = d_.granularity;
  for (size_t i = offset / g; i < (offset + bytes + g - 1) / g; ++i) {
    if (r->granule[i] != 0) continue;
    uint64_t h = 0;
    if (!pool_.empty()) {
      h = pool_.back();
      pool_.pop_back();
    } else {
      h = d_.create();
    }
    if (h == 0)
      return make_error(ErrorCode::internal, "cuda backend: out of device memory mapping " + std::to_string(bytes) +
                                                 " bytes of a sparse buffer (" + std::to_string(mapped_bytes()) +
                                                 " bytes of sparse buffers mapped)");
    if (std::string err = d_.map(reinterpret_cast<uintptr_t>(p) + i * g, h); !err.empty()) {
      pool_.push_back(h);
      return make_error(ErrorCode::internal, "cuda backend: map_sparse: " + err);
    }
    r->granule[i] = h;
    peak_ = std::max(peak_, ++mapped_);
  }
  return {};
}

Status SparseMemory::unmap(const void* p, size_t offset, size_t bytes) {
  TROUPE_ASSIGN_OR_RETURN(Range* r, checked(p, offset, bytes, "unmap_sparse"));
  const size_t g = d_.granularity;
  for (size_t i = offset / g; i < (offset + bytes + g - 1) / g; ++i) {
    if (r->granule[i] == 0) continue;
    d_.unmap(reinterpret_cast<uintptr_t>(p) + i * g);
    pool_.push_back(std::exchange(r->granule[i], 0));
    --mapped_;
  }
  return {};
}

std::vector<std::pair<size_t, size_t>> SparseMemory::mapped_ranges(const void* p) const {
  const auto it = ranges_.find(reinterpret_cast<uintptr_t>(p));
  if (it == ranges_.end()) return {};
  return mapped_granule_ranges(it->second.granule, d_.granularity, it->second.bytes);
}

void SparseMemory::trim() {
  for (uint64_t h : pool_) d_.release(h);
  pool_.clear();
}

}  // namespace troupe::kernels::cuda
