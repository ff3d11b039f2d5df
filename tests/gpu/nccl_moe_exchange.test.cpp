// gpu.nccl_moe_exchange: the expert-parallel exchange over NCCL (kernels/cuda/nccl_moe_exchange.h).
// One rank alone (one GPU): its self transfer of rows and counts comes back as sent. Two ranks (one
// thread and one GPU each, in one process; with two GPUs or more): uneven row counts both ways, a
// rank that sends a peer nothing, and the per-expert counts exchange; every rank receives exactly
// what its peers sent, in rank order, as MPI_Alltoallv lays it out. No GPU: skipped.
#include <thread>
#include <vector>

#include "check.h"
#include "gpu_test.h"
#include "nccl_moe_exchange.h"

namespace {

namespace cu = troupe::kernels::cuda;
using namespace troupe::gpu_test;

// rank r sends rows[r][p] floats to rank p, valued 1000 r + 100 p + i.
std::vector<float> payload(int r, const std::vector<size_t>& to) {
  std::vector<float> v;
  for (size_t p = 0; p < to.size(); ++p)
    for (size_t i = 0; i < to[p]; ++i) v.push_back(float(1000 * r + 100 * int(p)) + float(i));
  return v;
}

// One rank of R: the row exchange and the counts exchange; what it received, rows then counts.
void run_rank(const std::vector<uint8_t>& id, int R, int r, const std::vector<std::vector<size_t>>& rows,
              std::vector<float>& got_rows, std::vector<int32_t>& got_counts) {
  TROUPE_CUDA_CHECK(cudaSetDevice(r));
  cudaStream_t s;
  TROUPE_CUDA_CHECK(cudaStreamCreate(&s));
  cu::NcclComm comm(id, R, r);
  cu::NcclMoeExchange ex(comm, s);
  std::vector<size_t> recv_n(static_cast<size_t>(R));
  for (int p = 0; p < R; ++p) recv_n[size_t(p)] = rows[size_t(p)][size_t(r)];
  const std::vector<float> send = payload(r, rows[size_t(r)]);
  size_t total = 0;
  for (size_t n : recv_n) total += n;
  float *d_send = nullptr, *d_recv = nullptr;
  TROUPE_CUDA_CHECK(cudaMalloc(&d_send, (send.size() + 1) * sizeof(float)));
  TROUPE_CUDA_CHECK(cudaMalloc(&d_recv, (total + 1) * sizeof(float)));
  TROUPE_CUDA_CHECK(cudaMemcpy(d_send, send.data(), send.size() * sizeof(float), cudaMemcpyHostToDevice));
  const auto st = ex.alltoallv(d_send, rows[size_t(r)].data(), d_recv, recv_n.data());
  GPU_CHECK(st.ok(), st.ok() ? "" : st.error().message);
  got_rows.resize(total);
  TROUPE_CUDA_CHECK(cudaMemcpy(got_rows.data(), d_recv, total * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<int32_t> counts;  // two ints to each rank: 10 r + p and the rows sent there
  for (int p = 0; p < R; ++p) counts.insert(counts.end(), {10 * r + p, int32_t(rows[size_t(r)][size_t(p)])});
  got_counts.assign(counts.size(), -1);
  const auto ci = ex.alltoall_ints(counts.data(), got_counts.data(), 2);
  GPU_CHECK(ci.ok(), ci.ok() ? "" : ci.error().message);
  TROUPE_CUDA_REPORT(cudaFree(d_send));
  TROUPE_CUDA_REPORT(cudaFree(d_recv));
  TROUPE_CUDA_REPORT(cudaStreamDestroy(s));
}

// R ranks on threads; every rank's received rows and counts against what its peers sent.
void check_exchange(const char* what, const std::vector<std::vector<size_t>>& rows) {
  const int R = int(rows.size());
  const std::vector<uint8_t> id = cu::NcclComm::unique_id();
  std::vector<std::vector<float>> got(static_cast<size_t>(R));
  std::vector<std::vector<int32_t>> counts(static_cast<size_t>(R));
  std::vector<std::thread> ranks;
  for (int r = 0; r < R; ++r)
    ranks.emplace_back([&, r] {
      try {
        run_rank(id, R, r, rows, got[size_t(r)], counts[size_t(r)]);
      } catch (const std::exception& e) {
        std::printf("FAIL %s rank %d: %s\n", what, r, e.what());
        ++failures();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < R; ++r) {
    std::vector<float> want;
    std::vector<int32_t> want_counts;
    for (int p = 0; p < R; ++p) {
      for (size_t i = 0; i < rows[size_t(p)][size_t(r)]; ++i) want.push_back(float(1000 * p + 100 * r) + float(i));
      want_counts.insert(want_counts.end(), {10 * p + r, int32_t(rows[size_t(p)][size_t(r)])});
    }
    expect_near(std::string(what) + ": rows on rank " + std::to_string(r), got[size_t(r)], want, 0, 0);
    expect_near(std::string(what) + ": counts on rank " + std::to_string(r), counts[size_t(r)], want_counts, 0, 0);
  }
}

}  // namespace

int main() {
  if (!cu::NcclComm::available()) {
    std::printf("gpu.nccl_moe_exchange: this build has no NCCL: skipped\n");
    return 77;
  }
  return run_gpu_test("gpu.nccl_moe_exchange", [] {
    check_exchange("one rank", {{7}});
    int devices = 0;
    TROUPE_CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (devices < 2) {
      std::printf("gpu.nccl_moe_exchange: one GPU: the two-rank exchange is not run\n");
      return;
    }
    check_exchange("two ranks, uneven", {{3, 5}, {0, 2}});  // rank 1 sends rank 0 nothing
  });
}
