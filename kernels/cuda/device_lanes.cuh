// The device side of the kernel bodies: DeviceLanes (one block is one row's lanes; reductions
// through shared memory in lanes.h's tree order) and the two generic kernels every family
// launches, one for element bodies (grid-stride) and one for row bodies (one block per row).
#pragma once

#include <cuda_runtime.h>

#include "bodies/lanes.h"
#include "check.h"

namespace troupe::kernels::cuda {

struct BlockSync {
  __device__ void operator()() const { __syncthreads(); }
};

class DeviceLanes {
 public:
  __device__ explicit DeviceLanes(unsigned char* shared) : shared_(shared) {}
  __device__ int lane() const { return static_cast<int>(threadIdx.x); }
  __device__ int count() const { return static_cast<int>(blockDim.x); }
  __device__ void sync() const { __syncthreads(); }
  __device__ float sum(float v) const { return reduce(v, SumOp{}); }
  __device__ double sum(double v) const { return reduce(v, SumOp{}); }
  __device__ float max(float v) const { return reduce(v, MaxOp{}); }
  __device__ double max(double v) const { return reduce(v, MaxOp{}); }
  __device__ int min(int v) const { return reduce(v, MinOp{}); }

 private:
  template <class T, class Op>
  __device__ T reduce(T v, Op op) const {
    T* s = reinterpret_cast<T*>(shared_);
    s[lane()] = v;
    __syncthreads();
    tree_reduce(s, lane(), count(), op, BlockSync{});
    const T r = s[0];
    __syncthreads();
    return r;
  }
  unsigned char* shared_;
};

template <class Body>
__global__ void element_kernel(Body body, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    body(i);
}

template <class Body>
__global__ void row_kernel(Body body, int rows) {
  __shared__ alignas(8) unsigned char shared[kRowLanes * sizeof(double)];
  DeviceLanes lanes(shared);
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    body.row(lanes, r);
    __syncthreads();
  }
}

// Launches on `stream`; checks the launch (the kernel's own faults surface at the next checked call).
template <class Body>
void launch_elements(const Body& body, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const size_t want = (n + kElemThreads - 1) / kElemThreads;
  const unsigned blocks = static_cast<unsigned>(want < 65536 * 16 ? want : 65536 * 16);
  element_kernel<<<blocks, kElemThreads, 0, stream>>>(body, n);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

template <class Body>
void launch_rows(const Body& body, int rows, cudaStream_t stream) {
  if (rows <= 0) return;
  const unsigned blocks = static_cast<unsigned>(rows < 65536 * 16 ? rows : 65536 * 16);
  row_kernel<<<blocks, kRowLanes, 0, stream>>>(body, rows);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace troupe::kernels::cuda
