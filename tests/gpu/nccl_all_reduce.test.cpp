// gpu.nccl_all_reduce: two ranks (one thread and one GPU each, in one process) join one NcclComm
// through a unique id and all-reduce a flat gradient buffer, then broadcast weights from rank 0:
// every rank ends with the exact sum and rank 0's weights. Then the sharded learners' pair over
// shards of unequal length: a reduce-scatter leaves each rank its shard's exact sum, an all-gather
// of those shards gives every rank the whole sum. Needs two GPUs: skipped otherwise.
#include <thread>
#include <vector>

#include "gpu_test.h"
#include "check.h"
#include "nccl_comm.h"

int main() {
  using namespace troupe::gpu_test;
  namespace cu = troupe::kernels::cuda;
  if (!cu::NcclComm::available()) {
    std::printf("gpu.nccl_all_reduce: this build has no NCCL: skipped\n");
    return 77;
  }
  return run_gpu_test(
      "gpu.nccl_all_reduce",
      [] {
        const int R = 2;
        const size_t n = 1 << 20;
        const std::vector<uint8_t> id = cu::NcclComm::unique_id();
        const std::vector<size_t> bounds = {0, n / 2 + 16, n};  // (unequal shards: grouped ncclReduce/ncclBroadcast)
        std::vector<std::vector<float>> got(R), weights(R), scattered(R), gathered(R);
        std::vector<std::thread> ranks;
        for (int r = 0; r < R; ++r)
          ranks.emplace_back([&, r] {
           try {
            TROUPE_CUDA_CHECK(cudaSetDevice(r));
            cudaStream_t s;
            TROUPE_CUDA_CHECK(cudaStreamCreate(&s));
            std::vector<float> grad(n), w(n);
            for (size_t i = 0; i < n; ++i) grad[i] = float(r + 1) * float(i % 97), w[i] = float(r * 1000) + float(i % 13);
            float* d = nullptr;
            float* dw = nullptr;
            TROUPE_CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
            TROUPE_CUDA_CHECK(cudaMalloc(&dw, n * sizeof(float)));
            TROUPE_CUDA_CHECK(cudaMemcpy(d, grad.data(), n * sizeof(float), cudaMemcpyHostToDevice));
            TROUPE_CUDA_CHECK(cudaMemcpy(dw, w.data(), n * sizeof(float), cudaMemcpyHostToDevice));
            cu::NcclComm comm(id, R, r);
            comm.all_reduce_sum(d, n, s);
            comm.broadcast(dw, n, 0, s);
            TROUPE_CUDA_CHECK(cudaStreamSynchronize(s));
            got[size_t(r)].resize(n), weights[size_t(r)].resize(n);
            TROUPE_CUDA_CHECK(cudaMemcpy(got[size_t(r)].data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
            TROUPE_CUDA_CHECK(cudaMemcpy(weights[size_t(r)].data(), dw, n * sizeof(float), cudaMemcpyDeviceToHost));
            TROUPE_CUDA_CHECK(cudaMemcpy(d, grad.data(), n * sizeof(float), cudaMemcpyHostToDevice));
            comm.reduce_scatter_sum(d, bounds, s);
            scattered[size_t(r)].resize(n);
            TROUPE_CUDA_CHECK(cudaMemcpy(scattered[size_t(r)].data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
            comm.all_gather(d, bounds, s);
            gathered[size_t(r)].resize(n);
            TROUPE_CUDA_CHECK(cudaMemcpy(gathered[size_t(r)].data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
            TROUPE_CUDA_REPORT(cudaFree(d));
            TROUPE_CUDA_REPORT(cudaFree(dw));
            TROUPE_CUDA_REPORT(cudaStreamDestroy(s));
           } catch (const std::exception& e) {
            std::printf("FAIL rank %d: %s\n", r, e.what());
            ++failures();
           }
          });
        for (auto& t : ranks) t.join();
        std::vector<float> want(n), w0(n);
        for (size_t i = 0; i < n; ++i) want[i] = 3.0f * float(i % 97), w0[i] = float(i % 13);
        for (int r = 0; r < R; ++r) {
          expect_near("all_reduce rank " + std::to_string(r), got[size_t(r)], want, 0, 0);
          expect_near("broadcast rank " + std::to_string(r), weights[size_t(r)], w0, 0, 0);
          const size_t lo = bounds[size_t(r)], hi = bounds[size_t(r) + 1];
          expect_near("reduce-scatter rank " + std::to_string(r),
                      std::vector<float>(scattered[size_t(r)].begin() + long(lo), scattered[size_t(r)].begin() + long(hi)),
                      std::vector<float>(want.begin() + long(lo), want.begin() + long(hi)), 0, 0);
          expect_near("all-gather rank " + std::to_string(r), gathered[size_t(r)], want, 0, 0);
        }
      },
      2);
}
