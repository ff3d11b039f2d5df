// The host launcher of the kernel bodies: runs a body over the same grid its CUDA kernel uses, on
// the CPU, so ordinary tests check the bodies' indexing and math against the CPU ops. Element
// bodies run for every index of their grid (blocks of kElemThreads, the tail guarded by the body's
// own bound, as on the device). Row bodies run one "block" of `lanes` host threads per row, which
// meet at a std::barrier wherever a device block calls __syncthreads(); their reductions add in
// the device's tree order (lanes.h); block bodies likewise, with the block's shared array. Plain
// C++: never compiled by nvcc.
#pragma once

#include <barrier>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "lanes.h"

namespace troupe::kernels::cuda {

// One lane of a host block: the same interface as DeviceLanes.
class HostLanes {
 public:
  HostLanes(int lane, int count, unsigned char* shared, std::barrier<>* bar)
      : lane_(lane), count_(count), shared_(shared), bar_(bar) {}
  int lane() const { return lane_; }
  int count() const { return count_; }
  void sync() const { bar_->arrive_and_wait(); }
  float sum(float v) const { return reduce(v, SumOp{}); }
  double sum(double v) const { return reduce(v, SumOp{}); }
  float max(float v) const { return reduce(v, MaxOp{}); }
  double max(double v) const { return reduce(v, MaxOp{}); }
  int min(int v) const { return reduce(v, MinOp{}); }

 private:
  template <class T, class Op>
  T reduce(T v, Op op) const {
    T* s = reinterpret_cast<T*>(shared_);
    s[lane_] = v;
    sync();
    tree_reduce(s, lane_, count_, op, [this] { sync(); });
    const T r = s[0];
    sync();  // every lane has read s[0] before the next reduction overwrites it
    return r;
  }
  int lane_, count_;
  unsigned char* shared_;
  std::barrier<>* bar_;
};

// body(i) for i in [0, n), walked as the device grid walks it.
template <class Body>
void host_for_each(const Body& body, size_t n) {
  const size_t blocks = (n + kElemThreads - 1) / kElemThreads;
  for (size_t b = 0; b < blocks; ++b)
    for (int t = 0; t < kElemThreads; ++t) {
      const size_t i = b * kElemThreads + static_cast<size_t>(t);
      if (i < n) body(i);
    }
}

// body.row(lanes, r) for every row r in [0, rows), each row on one block of `lanes` host threads.
template <class Body>
void host_for_rows(const Body& body, int rows, int lanes) {
  if (rows <= 0) return;
  std::barrier<> bar(lanes);
  std::vector<unsigned char> shared(static_cast<size_t>(lanes) * sizeof(double) + 16);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(lanes));
  for (int l = 0; l < lanes; ++l)
    threads.emplace_back([&, l] {
      HostLanes lane(l, lanes, shared.data(), &bar);
      for (int r = 0; r < rows; ++r) {
        body.row(lane, r);
        lane.sync();  // the next row starts once every lane has finished this one
      }
    });
  for (auto& t : threads) t.join();
}

// body.block(lanes, b, shared) for every block b in [0, body.blocks()), each on `lanes` host
// threads sharing `shared_bytes` of the block's shared memory (the tile bodies, flash_attention.h),
// filled with NaN first so a read of shared memory no lane wrote shows in the results.
template <class Body>
void host_for_blocks(const Body& body, int lanes, size_t shared_bytes) {
  const int blocks = body.blocks();
  if (blocks <= 0) return;
  std::barrier<> bar(lanes);
  std::vector<double> shared((shared_bytes + sizeof(double) - 1) / sizeof(double),
                             std::numeric_limits<double>::quiet_NaN());
  auto* smem = reinterpret_cast<unsigned char*>(shared.data());
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(lanes));
  for (int l = 0; l < lanes; ++l)
    threads.emplace_back([&, l] {
      HostLanes lane(l, lanes, smem, &bar);
      for (int b = 0; b < blocks; ++b) {
        body.block(lane, b, smem);
        lane.sync();  // the next block reuses the shared memory once every lane is done
      }
    });
  for (auto& t : threads) t.join();
}

}  // namespace troupe::kernels::cuda
