// The NCCL communicator (nccl_comm.h).
#include "nccl_comm.h"

#include <cstdio>
#include <cstring>

#include "check.h"

#if TROUPE_HAVE_NCCL
#include <nccl.h>
#endif

namespace troupe::kernels::cuda {

#if TROUPE_HAVE_NCCL
bool NcclComm::available() { return true; }

std::vector<uint8_t> NcclComm::unique_id() {
  ncclUniqueId id;
  TROUPE_NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<uint8_t> bytes(sizeof(id));
  std::memcpy(bytes.data(), &id, sizeof(id));
  return bytes;
}

NcclComm::NcclComm(const std::vector<uint8_t>& id_bytes, int nranks, int rank) : nranks_(nranks), rank_(rank) {
  ncclUniqueId id;
  if (id_bytes.size() != sizeof(id))
    throw CudaError("NcclComm: a unique id is " + std::to_string(sizeof(id)) + " bytes, got " +
                    std::to_string(id_bytes.size()));
  std::memcpy(&id, id_bytes.data(), sizeof(id));
  ncclComm_t c = nullptr;
  TROUPE_NCCL_CHECK(ncclCommInitRank(&c, nranks, id, rank));
  comm_ = c;
}

NcclComm::~NcclComm() {
  if (comm_)
    if (const ncclResult_t r = ncclCommDestroy(static_cast<ncclComm_t>(comm_)); r != ncclSuccess)
      std::fprintf(stderr, "troupe: %s\n",
                   call_error_message("ncclCommDestroy", __FILE__, __LINE__, ncclGetErrorString(r)).c_str());
}

void NcclComm::all_reduce_sum(float* buf, size_t n, cudaStream_t stream) {
  TROUPE_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, static_cast<ncclComm_t>(comm_), stream));
}

void NcclComm::broadcast(float* buf, size_t n, int root, cudaStream_t stream) {
  TROUPE_NCCL_CHECK(ncclBroadcast(buf, buf, n, ncclFloat32, root, static_cast<ncclComm_t>(comm_), stream));
}
#else
bool NcclComm::available() { return false; }
std::vector<uint8_t> NcclComm::unique_id() { throw CudaError("this build of troupe has no NCCL"); }
NcclComm::NcclComm(const std::vector<uint8_t>&, int, int) { throw CudaError("this build of troupe has no NCCL"); }
NcclComm::~NcclComm() = default;
void NcclComm::all_reduce_sum(float*, size_t, cudaStream_t) {}
void NcclComm::broadcast(float*, size_t, int, cudaStream_t) {}
#endif

}  // namespace troupe::kernels::cuda
