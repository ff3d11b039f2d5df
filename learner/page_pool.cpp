// PagePool and PooledRanges (page_pool.h): a memfd's pages mapped in and out of a buffer's spans
// with MAP_FIXED. Free pool pages are the gaps between the live spans (kept by offset); a span takes
// the first gap that fits.
#include "troupe/learner/page_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace troupe::learner {

std::pair<float*, float*> whole_pages(float* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(p + n);
  const uintptr_t s = (a + page - 1) / page * page, e = b / page * page;
  if (e <= s) return {p + n, p + n};
  return {reinterpret_cast<float*>(s), reinterpret_cast<float*>(e)};
}

PagePoolFaults& page_pool_faults() {
  static PagePoolFaults faults;
  return faults;
}

std::unique_ptr<PagePool> PagePool::create(size_t bytes) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  bytes = (bytes + page - 1) / page * page;
  const PagePoolFaults& faults = page_pool_faults();
  if (faults.max_bytes > 0) bytes = std::min(bytes, faults.max_bytes / page * page);
  if (bytes == 0 || faults.no_memfd) return nullptr;
  const int fd = memfd_create("troupe_zero3_gathers", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return nullptr;
  }
  return std::unique_ptr<PagePool>(new PagePool(fd, bytes));
}

PagePool::~PagePool() {
  // (spans still mapped keep their pages until the buffer goes; the owner unmaps them first)
  close(fd_);
}

bool PagePool::map(char* begin, size_t bytes) {
  PagePoolFaults& faults = page_pool_faults();
  if (bytes == 0) return false;
  // (a span whose unmap failed stays there, its pages that place's alone: the caller writes into them)
  for (const Span& s : live_)
    if (s.at == begin) return false;
  size_t offset = 0;
  auto at = live_.begin();
  for (; at != live_.end() && at->offset - offset < bytes; ++at) offset = at->offset + at->bytes;
  const bool fits = at != live_.end() || bytes_ - offset >= bytes;
  void* p = !fits || faults.fail_map ? MAP_FAILED
                                     : mmap(begin, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
                                            fd_, static_cast<off_t>(offset));
  if (p == MAP_FAILED) {  // (a failed MAP_FIXED leaves the old mapping in place)
    ++faults.refused;
    return false;
  }
  ++faults.mapped;
  live_.insert(at, Span{begin, offset, bytes});
  return true;
}

bool PagePool::unmap(char* begin) {
  const auto it = std::find_if(live_.begin(), live_.end(), [&](const Span& s) { return s.at == begin; });
  if (it == live_.end()) return false;
  // Fails only without the memory for a new mapping: the span then stays mapped and live (its pool
  // pages are never mapped anywhere else), zeroed here as fresh pages would read (MADV_DONTNEED, the
  // caller's drop, does not zero shared pages: a gradient range would add its next sum to its last).
  PagePoolFaults& faults = page_pool_faults();
  if (faults.fail_unmap ||
      mmap(begin, it->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
    std::memset(begin, 0, it->bytes);
    ++faults.stuck;
    return false;
  }
  ++faults.unmapped;
  live_.erase(it);
  return true;
}

std::unique_ptr<PooledRanges> PooledRanges::create(std::span<float> buf, size_t lo, size_t hi, size_t ranges,
                                                   size_t bytes) {
  auto pool = PagePool::create(bytes);
  if (!pool) return nullptr;
  return std::unique_ptr<PooledRanges>(new PooledRanges(buf, lo, hi, ranges, std::move(pool)));
}

PooledRanges::~PooledRanges() {
  for (size_t k = 0; k < at_.size(); ++k) unmap(k);
}

std::array<PooledRanges::Span, 2> PooledRanges::outer(size_t begin, size_t end) const {
  auto pages = [&](size_t b, size_t e) -> Span {
    if (e <= b) return {nullptr, 0};
    const auto [s, f] = whole_pages(buf_.data() + b, e - b);
    if (f <= s) return {nullptr, 0};
    return {reinterpret_cast<char*>(s), static_cast<size_t>(f - s) * sizeof(float)};
  };
  return {pages(begin, std::min(end, lo_)), pages(std::max(begin, hi_), end)};
}

std::array<PooledRanges::Span, 2> PooledRanges::map(size_t k, size_t begin, size_t end) {
  auto spans = outer(begin, end);
  for (size_t j = 0; j < spans.size(); ++j) {
    if (spans[j].second > 0 && !at_[k][j] && pool_->map(spans[j].first, spans[j].second))
      at_[k][j] = spans[j].first;
    else
      spans[j] = {nullptr, 0};
  }
  return spans;
}

void PooledRanges::unmap(size_t k) {
  for (char*& at : at_[k])
    if (at && pool_->unmap(at)) at = nullptr;
}

}  // namespace troupe::learner
