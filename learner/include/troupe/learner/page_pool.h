// Physical pages that learner.shard parameters' gathers reuse (ParamShards): a memfd whose pages are
// mapped over the whole pages of a buffer span while that span is gathered, and swapped back for
// fresh anonymous pages (which read as zero and hold no memory) when it is dropped. A gather then
// writes into pages that exist already, instead of faulting in and zeroing new ones each time, and
// the memory the spans hold together never exceeds the pool's size. Invariant: each pool page is
// mapped at one place at most; only spans map() mapped are ever replaced.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace troupe::learner {

class PagePool {
 public:
  // A pool of `bytes` (rounded up to whole pages); null where it cannot be made (no memfd_create,
  // ftruncate refused), and the caller then faults pages in as without it.
  static std::unique_ptr<PagePool> create(size_t bytes);
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // Maps free pool pages over [begin, begin + bytes) (page-aligned, a whole number of pages) and
  // touches them in (MAP_POPULATE); what the span held before is gone. False, with nothing changed,
  // when no run of free pool pages is that long or the mapping fails.
  bool map(char* begin, size_t bytes);
  // Fresh anonymous pages over the span map() mapped at `begin` (they read as zero), its pool pages
  // free again. False when no span is mapped there, or when the new mapping fails: the span then
  // stays mapped there, its pool pages that place's alone (map() refuses that place from then on).
  bool unmap(char* begin);
  size_t bytes() const { return bytes_; }

 private:
  PagePool(int fd, size_t bytes) : fd_(fd), bytes_(bytes) {}
  struct Span {
    char* at;
    size_t offset, bytes;
  };
  int fd_;
  size_t bytes_;
  std::vector<Span> live_;  // by offset
};

}  // namespace troupe::learner
