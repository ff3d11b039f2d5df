// gemm_batch (launchers.h): the independent GEMMs of one phase of the MoE experts, issued the way
// troupe/kernels/expert_gemm.h's setting says -- one grouped-batched cuBLAS call, side streams,
// or one after the other on the queue.
#include <algorithm>
#include <string>
#include <vector>

#include "check.h"
#include "launchers.h"
#include "troupe/kernels/compute_dtype.h"
#include "troupe/kernels/expert_gemm.h"

namespace troupe::kernels::cuda {
namespace {

constexpr int kSideStreams = 4;

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

void one_by_one(const Queue& q, const std::vector<RowMajorGemm>& calls) {
  for (const RowMajorGemm& c : calls)
    gemm(q, c.trans_a, c.trans_b, c.M, c.N, c.K, c.alpha, c.A, c.lda, c.B, c.ldb, c.beta, c.C, c.ldc);
}

// Every call its own group of one: the sizes, leading dimensions and scalars are host arrays, the
// operand pointers one device array (A's, then B's, then C's) copied up on the queue first. The
// copy is stream-ordered, so the next batch's copy into the same array waits for this GEMM.
void grouped(const Queue& q, const std::vector<RowMajorGemm>& calls) {
  const size_t G = calls.size();
  std::vector<cublasOperation_t> ta(G), tb(G);
  std::vector<int> m(G), n(G), k(G), lda(G), ldb(G), ldc(G), group_size(G, 1);
  std::vector<float> alpha(G), beta(G);
  std::vector<const float*> ptrs(3 * G);
  for (size_t i = 0; i < G; ++i) {
    const RowMajorGemm& c = calls[i];
    const ColMajorGemm g = col_major_gemm(c.trans_a, c.trans_b, c.M, c.N, c.K, c.A, c.lda, c.B, c.ldb, c.C, c.ldc);
    ta[i] = op(g.trans_first);
    tb[i] = op(g.trans_second);
    m[i] = g.m, n[i] = g.n, k[i] = g.k;
    lda[i] = g.ld_first, ldb[i] = g.ld_second, ldc[i] = g.ldc;
    alpha[i] = c.alpha, beta[i] = c.beta;
    ptrs[i] = g.first, ptrs[G + i] = g.second, ptrs[2 * G + i] = g.c;
  }
  ExpertGemmWorkspace& ws = *q.experts;
  const size_t bytes = sizeof(float*) * ptrs.size();
  TROUPE_DEVICE_GROW(ws.pointers, ws.pointer_bytes, bytes, q.stream);
  // From pageable memory the copy returns once `ptrs` is staged: it may go out of scope after.
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(ws.pointers, ptrs.data(), bytes, cudaMemcpyHostToDevice, q.stream));
  auto* dev = static_cast<const float**>(ws.pointers);
  const bool tf32 = allow_tf32();  // policy.allow_tf32, as gemm()
  if (tf32) TROUPE_CUBLAS_CHECK(cublasSetMathMode(q.blas, CUBLAS_TF32_TENSOR_OP_MATH));
  const cublasStatus_t st = cublasSgemmGroupedBatched(
      q.blas, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(), dev, lda.data(), dev + G, ldb.data(),
      beta.data(), const_cast<float* const*>(dev + 2 * G), ldc.data(), static_cast<int>(G), group_size.data());
  if (tf32) TROUPE_CUBLAS_CHECK(cublasSetMathMode(q.blas, CUBLAS_PEDANTIC_MATH));
  TROUPE_CUBLAS_CHECK(st);
}

void make_side_streams(ExpertGemmWorkspace& ws) {
  TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&ws.fork, cudaEventDisableTiming));
  for (int s = 0; s < kSideStreams; ++s) {
    cudaStream_t stream = nullptr;
    cublasHandle_t handle = nullptr;
    cudaEvent_t done = nullptr;
    TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TROUPE_CUBLAS_CHECK(cublasCreate(&handle));
    TROUPE_CUBLAS_CHECK(cublasSetStream(handle, stream));
    TROUPE_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));  // as the queue's handle: no TF32
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    ws.streams.push_back(stream);
    ws.handles.push_back(handle);
    ws.done.push_back(done);
  }
}

// Fork: every side stream waits for the queue's work so far; call i runs on side stream i mod S
// with that stream's own handle (a handle's workspace must not be shared by concurrent streams);
// join: the queue waits for each side stream used. No host synchronization.
void on_streams(const Queue& q, const std::vector<RowMajorGemm>& calls) {
  ExpertGemmWorkspace& ws = *q.experts;
  if (ws.streams.empty()) make_side_streams(ws);
  const size_t used = std::min(calls.size(), ws.streams.size());
  TROUPE_CUDA_CHECK(cudaEventRecord(ws.fork, q.stream));
  for (size_t s = 0; s < used; ++s) TROUPE_CUDA_CHECK(cudaStreamWaitEvent(ws.streams[s], ws.fork, 0));
  for (size_t i = 0; i < calls.size(); ++i) {
    const size_t s = i % used;
    Queue side;
    side.stream = ws.streams[s];
    side.blas = ws.handles[s];
    const RowMajorGemm& c = calls[i];
    gemm(side, c.trans_a, c.trans_b, c.M, c.N, c.K, c.alpha, c.A, c.lda, c.B, c.ldb, c.beta, c.C, c.ldc);
  }
  for (size_t s = 0; s < used; ++s) {
    TROUPE_CUDA_CHECK(cudaEventRecord(ws.done[s], ws.streams[s]));
    TROUPE_CUDA_CHECK(cudaStreamWaitEvent(q.stream, ws.done[s], 0));
  }
}

}  // namespace

void gemm_batch(const Queue& q, const std::vector<RowMajorGemm>& calls) {
  if (calls.empty()) return;
  if (!q.experts || calls.size() == 1 || compute_dtype() == ComputeDtype::bf16) return one_by_one(q, calls);
  switch (expert_gemm()) {
    case ExpertGemm::grouped: return grouped(q, calls);
    case ExpertGemm::streams: return on_streams(q, calls);
    case ExpertGemm::per_expert: return one_by_one(q, calls);
  }
}

}  // namespace troupe::kernels::cuda
