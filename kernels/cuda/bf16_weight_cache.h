// The bf16 copies of the model's weights that the bf16 GEMMs read (policy.compute_dtype bf16), so
// weights are rounded once per write (once per optimizer step) rather than packed again for every
// GEMM. Plain C++ (memory and conversion injected), so the host tests drive it. Invariant: a
// lookup never returns a copy older than the last weights_written() of its arena; an operand that
// is not wholly inside one arena gets no copy (the GEMM packs it as before).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace troupe::kernels::cuda {

class Bf16WeightCache {
 public:
  struct Memory {
    std::function<uint16_t*(size_t n)> alloc;                    // n bf16 values; nullptr or throws on failure
    std::function<void(uint16_t*)> release;
    std::function<void(uint16_t* dst, const float* src, size_t n)> convert;  // queued on the GEMMs' stream
  };
  explicit Bf16WeightCache(Memory mem) : mem_(std::move(mem)) {}
  Bf16WeightCache(const Bf16WeightCache&) = delete;
  Bf16WeightCache& operator=(const Bf16WeightCache&) = delete;
  ~Bf16WeightCache() { clear(); }

  // [w, w + n) was written: registers it (or re-sizes it) and marks its copy stale.
  void weights_written(const float* w, size_t n) {
    for (Arena& a : arenas_)
      if (a.base == w) {
        if (a.n != n) drop_copy(a);
        a.n = n;
        a.stale = true;
        return;
      }
    arenas_.push_back({w, n, nullptr, true, 0});
  }
  // The buffer at `w` is freed: its arena (if any) and its copy go.
  void forget(const void* w) {
    for (size_t i = 0; i < arenas_.size(); ++i)
      if (arenas_[i].base == w) {
        drop_copy(arenas_[i]);
        arenas_.erase(arenas_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
  }
  // The bf16 copy of [p, p + extent) when that lies inside one arena (converting the arena first if
  // it was written since), else nullptr. An allocation failure also gives nullptr (the GEMM then
  // packs its operand as it would without the cache).
  const uint16_t* lookup(const float* p, size_t extent) {
    for (Arena& a : arenas_) {
      const auto at = reinterpret_cast<uintptr_t>(p), lo = reinterpret_cast<uintptr_t>(a.base);
      const size_t off = (at - lo) / sizeof(float);  // (pointers of different buffers compare as integers)
      if (at < lo || off >= a.n || extent > a.n - off) continue;
      if (!a.copy) {
        try {
          a.copy = mem_.alloc(a.n);
        } catch (...) {
          a.copy = nullptr;
        }
        if (!a.copy) return nullptr;
        a.stale = true;
      }
      if (a.stale) {
        mem_.convert(a.copy, a.base, a.n);
        a.stale = false;
        ++a.conversions;
      }
      return a.copy + off;
    }
    return nullptr;
  }
  // How many times the arena at `w` was converted (0 when unknown): what the tests count.
  uint64_t conversions(const float* w) const {
    for (const Arena& a : arenas_)
      if (a.base == w) return a.conversions;
    return 0;
  }
  size_t arenas() const { return arenas_.size(); }
  void clear() {
    for (Arena& a : arenas_) drop_copy(a);
    arenas_.clear();
  }

 private:
  struct Arena {
    const float* base;
    size_t n;
    uint16_t* copy;
    bool stale;
    uint64_t conversions;
  };
  void drop_copy(Arena& a) {
    if (a.copy) mem_.release(a.copy);
    a.copy = nullptr;
    a.stale = true;
  }
  Memory mem_;
  std::vector<Arena> arenas_;
};

}  // namespace troupe::kernels::cuda
