// The expert-parallel exchange over NCCL (nccl_moe_exchange.h).
#include "nccl_moe_exchange.h"

#include <exception>
#include <string>
#include <vector>

#include "check.h"

namespace troupe::kernels::cuda {

namespace {
// A CUDA or NCCL failure (thrown by the checked calls) as the Status the MoE layer returns.
template <class Fn>
Status as_status(const char* what, int rank, Fn fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal,
                      std::string("expert-parallel ") + what + " on rank " + std::to_string(rank) + ": " + e.what());
  }
  return {};
}
}  // namespace

NcclMoeExchange::~NcclMoeExchange() {
  if (scratch_) TROUPE_CUDA_REPORT(cudaFree(scratch_));
}

Status NcclMoeExchange::alltoall_ints(const int32_t* send, int32_t* recv, int n) {
  const auto P = static_cast<size_t>(size()), each = static_cast<size_t>(n);
  return as_status("count exchange", rank(), [&] {
    void* grown = scratch_;
    TROUPE_DEVICE_GROW(grown, scratch_bytes_, sizeof(int32_t) * 2 * P * each, stream_);
    scratch_ = static_cast<int32_t*>(grown);
    int32_t* out = scratch_;
    int32_t* in = scratch_ + P * each;
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(out, send, sizeof(int32_t) * P * each, cudaMemcpyHostToDevice, stream_));
    const std::vector<size_t> counts(P, each);
    comm_.all_to_all_v(out, counts.data(), in, counts.data(), true, stream_);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(recv, in, sizeof(int32_t) * P * each, cudaMemcpyDeviceToHost, stream_));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  });
}

Status NcclMoeExchange::alltoallv(const float* send, const size_t* send_counts, float* recv,
                                  const size_t* recv_counts) {
  return as_status("row exchange", rank(),
                   [&] { comm_.all_to_all_v(send, send_counts, recv, recv_counts, false, stream_); });
}

}  // namespace troupe::kernels::cuda
