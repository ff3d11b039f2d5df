// The shared ground of every CUDA kernel body (kernels/cuda/bodies/*.h): TROUPE_HD marks a function
// __host__ __device__ under nvcc and nothing under a plain C++ compiler, so the same body runs in a
// CUDA kernel and in host_grid.h's host launcher; the math wrappers pick the matching libm or CUDA
// function; a Lanes type is the block a row body runs on (lane index, lane count and block-wide
// reductions). DeviceLanes (device_lanes.cuh) reduces through shared memory, HostLanes
// (host_grid.h) through the same tree on host threads, so both add in the same order.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define TROUPE_HD __host__ __device__
#else
#define TROUPE_HD
#endif

namespace troupe::kernels::cuda {

TROUPE_HD inline float hd_exp(float x) { return expf(x); }
TROUPE_HD inline double hd_exp(double x) { return exp(x); }
TROUPE_HD inline float hd_log(float x) { return logf(x); }
TROUPE_HD inline double hd_log(double x) { return log(x); }
TROUPE_HD inline float hd_sqrt(float x) { return sqrtf(x); }
TROUPE_HD inline double hd_sqrt(double x) { return sqrt(x); }
TROUPE_HD inline float hd_cos(float x) { return cosf(x); }
TROUPE_HD inline double hd_cos(double x) { return cos(x); }
TROUPE_HD inline float hd_sin(float x) { return sinf(x); }
TROUPE_HD inline double hd_sin(double x) { return sin(x); }
TROUPE_HD inline float hd_pow(float x, float y) { return powf(x, y); }
template <class T>
TROUPE_HD inline T hd_max(T a, T b) { return a > b ? a : b; }
template <class T>
TROUPE_HD inline T hd_min(T a, T b) { return a < b ? a : b; }
TROUPE_HD inline float hd_neg_inf() { return -__builtin_huge_valf(); }

// Threads per block of every row kernel (one block per row) and of every element kernel.
inline constexpr int kRowLanes = 256;
inline constexpr int kElemThreads = 256;

// The tree every block reduction adds in, on the device and on the host alike: v[0..n) in place,
// stride halving from the largest power of two below n; after it v[0] holds the result. `sync`
// runs between levels (a barrier) and `lane` is the caller's index; every lane calls it.
template <class T, class Op, class Sync>
TROUPE_HD inline void tree_reduce(T* v, int lane, int n, Op op, Sync sync) {
  int s = 1;
  while (s * 2 < n) s *= 2;
  for (; s > 0; s /= 2) {
    if (lane < s && lane + s < n) v[lane] = op(v[lane], v[lane + s]);
    sync();
  }
}

struct SumOp {
  template <class T>
  TROUPE_HD T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <class T>
  TROUPE_HD T operator()(T a, T b) const { return a > b ? a : b; }
};
struct MinOp {
  template <class T>
  TROUPE_HD T operator()(T a, T b) const { return a < b ? a : b; }
};

}  // namespace troupe::kernels::cuda
