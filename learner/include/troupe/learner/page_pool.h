// Physical pages that learner.shard parameters' gathers reuse (ParamShards): a memfd whose pages are
// mapped over the whole pages of a buffer span while that span is gathered, and swapped back for
// fresh anonymous pages (which read as zero and hold no memory) when it is dropped. A gather then
// writes into pages that exist already, instead of faulting in and zeroing new ones each time, and
// the memory the spans hold together never exceeds the pool's size. Invariant: each pool page is
// mapped at one place at most; only spans map() mapped are ever replaced.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace troupe::learner {

// The whole pages inside [p, p + n): their first float and the end ({p + n, p + n}: none).
std::pair<float*, float*> whole_pages(float* p, size_t n);

// For tests only (tests/learner/page_pool.cpp): forces the fallbacks below as if the system refused,
// and counts what the pools did. All off in a run; read and written on the learner's thread.
struct PagePoolFaults {
  bool no_memfd = false;    // create() finds no memfd_create: no pool
  size_t max_bytes = 0;     // > 0: a pool holds at most this (rounded down to whole pages): spans run out of pages
  bool fail_map = false;    // map()'s mmap fails
  bool fail_unmap = false;  // unmap()'s mmap fails: the span stays mapped
  size_t mapped = 0, refused = 0, unmapped = 0, stuck = 0;  // spans map()ped, map() refused, unmap()ped, left mapped
};
PagePoolFaults& page_pool_faults();

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
  // stays mapped there, zeroed (as fresh pages read), its pool pages that place's alone (map()
  // refuses that place from then on).
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

// The ranges of one buffer (ParamShards' weights or gradients) backed by a PagePool while they are
// whole: per range, the whole pages of its parts outside this rank's shard [lo, hi), before and after
// it, mapped from the pool where they fit. Unmaps what is still mapped when it goes (the buffer
// must outlive it).
class PooledRanges {
 public:
  using Span = std::pair<char*, size_t>;  // start, bytes; {nullptr, 0}: none
  // The pool holds `bytes`; null where it cannot be made.
  static std::unique_ptr<PooledRanges> create(std::span<float> buf, size_t lo, size_t hi, size_t ranges, size_t bytes);
  ~PooledRanges();
  // The whole pages of [begin, end) outside the shard.
  std::array<Span, 2> outer(size_t begin, size_t end) const;
  // Pool pages over range k = [begin, end)'s outer pages not mapped yet, where they fit; the spans
  // this call mapped (what they held before is gone).
  std::array<Span, 2> map(size_t k, size_t begin, size_t end);
  // Range k's pool pages back to the pool, fresh anonymous pages in their place.
  void unmap(size_t k);

 private:
  PooledRanges(std::span<float> buf, size_t lo, size_t hi, size_t ranges, std::unique_ptr<PagePool> pool)
      : buf_(buf), lo_(lo), hi_(hi), pool_(std::move(pool)), at_(ranges, {nullptr, nullptr}) {}
  std::span<float> buf_;
  size_t lo_, hi_;
  std::unique_ptr<PagePool> pool_;
  std::vector<std::array<char*, 2>> at_;
};

}  // namespace troupe::learner
