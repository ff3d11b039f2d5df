// PagePool (page_pool.h): a memfd's pages mapped in and out of a buffer's spans with MAP_FIXED.
// Free pool pages are the gaps between the live spans (kept by offset); a span takes the first gap
// that fits.
#include "troupe/learner/page_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace troupe::learner {

std::unique_ptr<PagePool> PagePool::create(size_t bytes) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  bytes = (bytes + page - 1) / page * page;
  if (bytes == 0) return nullptr;
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
  if (bytes == 0) return false;
  // (a span whose unmap failed stays there, its pages that place's alone: the caller writes into them)
  for (const Span& s : live_)
    if (s.at == begin) return false;
  size_t offset = 0;
  auto at = live_.begin();
  for (; at != live_.end() && at->offset - offset < bytes; ++at) offset = at->offset + at->bytes;
  if (at == live_.end() && bytes_ - offset < bytes) return false;
  void* p = mmap(begin, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd_,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) return false;  // (a failed MAP_FIXED leaves the old mapping in place)
  live_.insert(at, Span{begin, offset, bytes});
  return true;
}

bool PagePool::unmap(char* begin) {
  const auto it = std::find_if(live_.begin(), live_.end(), [&](const Span& s) { return s.at == begin; });
  if (it == live_.end()) return false;
  // Fails only without the memory for a new mapping: the span then stays mapped and live (its pool
  // pages are never mapped anywhere else), and the caller drops it as ordinary memory.
  if (mmap(begin, it->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
    return false;
  live_.erase(it);
  return true;
}

}  // namespace troupe::learner
