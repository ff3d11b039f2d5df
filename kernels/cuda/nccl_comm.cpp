// The NCCL communicator (nccl_comm.h): a non-blocking communicator whose join and collectives are
// watched against a deadline (nccl_watch.h); an error or a dead peer aborts it and names the rank.
#include "nccl_comm.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "alltoallv_plan.h"
#include "check.h"
#include "nccl_watch.h"

#if TROUPE_HAVE_NCCL
#include <nccl.h>
#endif

namespace troupe::kernels::cuda {

#if TROUPE_HAVE_NCCL
namespace {
double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// The communicator's state: done (ncclSuccess), pending (ncclInProgress), or failed with NCCL's words.
NcclPoll poll_comm(ncclComm_t c) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(c, &state);
  if (r != ncclSuccess) return {NcclPoll::State::failed, std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r)};
  if (state == ncclSuccess) return {NcclPoll::State::done, ""};
  if (state == ncclInProgress) return {NcclPoll::State::pending, ""};
  const char* last = ncclGetLastError(c);
  return {NcclPoll::State::failed, std::string(ncclGetErrorString(state)) + (last && *last ? std::string(": ") + last : "")};
}
// The first failure among the calls of one group (ncclGroupStart .. ncclGroupEnd), which is always
// closed before the failure is thrown.
struct GroupErrors {
  ncclResult_t failed = ncclSuccess;
  const char* call = "";
  void note(ncclResult_t r, const char* c) {
    if (r != ncclSuccess && r != ncclInProgress && failed == ncclSuccess) failed = r, call = c;
  }
  void raise() const {
    if (failed != ncclSuccess) throw_nccl_error(failed, call, __FILE__, __LINE__);
  }
};
}  // namespace

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
  const Result<double> timeout = nccl_timeout_s(std::getenv("TROUPE_NCCL_TIMEOUT_S"));
  if (!timeout.ok()) throw CudaError(timeout.error().message);
  timeout_s_ = *timeout;
  std::memcpy(&id, id_bytes.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // returns at once (ncclInProgress); the join is polled below
  ncclComm_t c = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&c, nranks, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (c) (void)ncclCommAbort(c);
    throw_nccl_error(r, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  comm_ = c;
  const Status st = nccl_wait(
      "joining the communicator", rank_, nranks_, timeout_s_, [c] { return poll_comm(c); }, seconds_now, sleep_s,
      [this] { aborted_ = true; (void)ncclCommAbort(static_cast<ncclComm_t>(comm_)); });
  if (!st.ok()) throw CudaError(st.error().message);
  TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

NcclComm::~NcclComm() {
  if (done_) (void)cudaEventDestroy(done_);
  if (comm_ && !aborted_)
    if (const ncclResult_t r = ncclCommDestroy(static_cast<ncclComm_t>(comm_)); r != ncclSuccess)
      std::fprintf(stderr, "troupe: %s\n",
                   call_error_message("ncclCommDestroy", __FILE__, __LINE__, ncclGetErrorString(r)).c_str());
}

// A collective on a non-blocking communicator may return ncclInProgress while it is enqueued;
// then its completion event is polled together with the communicator's async error.
void NcclComm::wait(const std::string& what, cudaStream_t stream) {
  if (aborted_) throw CudaError("NCCL rank " + std::to_string(rank_) + ": " + what + ": the communicator was aborted earlier");
  auto* c = static_cast<ncclComm_t>(comm_);
  bool recorded = false;
  const Status st = nccl_wait(
      what, rank_, nranks_, timeout_s_,
      [&]() -> NcclPoll {
        NcclPoll p = poll_comm(c);
        if (p.state != NcclPoll::State::done) return p;  // still enqueuing, or failed
        if (!recorded) {
          if (cudaEventRecord(done_, stream) != cudaSuccess) return {NcclPoll::State::failed, "cudaEventRecord failed"};
          recorded = true;
        }
        const cudaError_t q = cudaEventQuery(done_);
        if (q == cudaSuccess) return {NcclPoll::State::done, ""};
        if (q == cudaErrorNotReady) return {NcclPoll::State::pending, ""};
        (void)cudaGetLastError();
        return {NcclPoll::State::failed, std::string("the stream failed: ") + cudaGetErrorString(q)};
      },
      seconds_now, sleep_s, [&] { aborted_ = true; (void)ncclCommAbort(c); });
  if (!st.ok()) throw CudaError(st.error().message);
}

void NcclComm::all_reduce_sum(float* buf, size_t n, cudaStream_t stream) {
  const ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, static_cast<ncclComm_t>(comm_), stream);
  if (r != ncclSuccess && r != ncclInProgress) throw_nccl_error(r, "ncclAllReduce", __FILE__, __LINE__);
  wait("all-reduce of " + std::to_string(n) + " floats", stream);
}

void NcclComm::broadcast(float* buf, size_t n, int root, cudaStream_t stream) {
  const ncclResult_t r = ncclBroadcast(buf, buf, n, ncclFloat32, root, static_cast<ncclComm_t>(comm_), stream);
  if (r != ncclSuccess && r != ncclInProgress) throw_nccl_error(r, "ncclBroadcast", __FILE__, __LINE__);
  wait("broadcast of " + std::to_string(n) + " floats from rank " + std::to_string(root), stream);
}
size_t NcclComm::check_bounds(std::span<const size_t> bounds, const char* what) const {
  const std::string where = "NCCL rank " + std::to_string(rank_) + ": " + what + ": ";
  if (aborted_) throw CudaError(where + "the communicator was aborted earlier");
  if (bounds.size() != static_cast<size_t>(nranks_) + 1 || bounds.front() != 0)
    throw CudaError(where + std::to_string(bounds.size()) + " shard bounds for " + std::to_string(nranks_) +
                    " ranks (want ranks + 1 offsets from 0)");
  for (size_t r = 0; r + 1 < bounds.size(); ++r)
    if (bounds[r + 1] < bounds[r]) throw CudaError(where + "the shard bounds descend at rank " + std::to_string(r));
  return bounds.back();
}

namespace {
// call(shard, count, r) for each rank r's non-empty shard of buf, in one group (closed before a
// failure is thrown).
template <class Call>
void per_shard_group(float* buf, std::span<const size_t> bounds, int nranks, const char* name, Call call) {
  GroupErrors errors;
  errors.note(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < nranks; ++r) {
    const size_t lo = bounds[static_cast<size_t>(r)], count = bounds[static_cast<size_t>(r) + 1] - lo;
    if (count > 0) errors.note(call(buf + lo, count, r), name);
  }
  errors.note(ncclGroupEnd(), "ncclGroupEnd");
  errors.raise();
}
}  // namespace

void NcclComm::reduce_scatter_sum(float* buf, std::span<const size_t> bounds, cudaStream_t stream) {
  const size_t n = check_bounds(bounds, "reduce-scatter");
  auto* c = static_cast<ncclComm_t>(comm_);
  per_shard_group(buf, bounds, nranks_, "ncclReduce", [&](float* shard, size_t count, int root) {
    return ncclReduce(shard, shard, count, ncclFloat32, ncclSum, root, c, stream);
  });
  wait("reduce-scatter of " + std::to_string(n) + " floats", stream);
}

void NcclComm::all_gather(float* buf, std::span<const size_t> bounds, cudaStream_t stream) {
  const size_t n = check_bounds(bounds, "all-gather");
  auto* c = static_cast<ncclComm_t>(comm_);
  per_shard_group(buf, bounds, nranks_, "ncclBroadcast", [&](float* shard, size_t count, int root) {
    return ncclBroadcast(shard, shard, count, ncclFloat32, root, c, stream);
  });
  wait("all-gather of " + std::to_string(n) + " floats", stream);
}

void NcclComm::all_to_all_v(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                            bool ints, cudaStream_t stream) {
  const auto plan = alltoallv_plan(send_counts, recv_counts, nranks_, rank_);
  if (!plan.ok()) throw CudaError("NCCL rank " + std::to_string(rank_) + ": " + plan.error().message);
  if (aborted_) throw CudaError("NCCL rank " + std::to_string(rank_) + ": all-to-all: the communicator was aborted earlier");
  auto* c = static_cast<ncclComm_t>(comm_);
  const ncclDataType_t type = ints ? ncclInt32 : ncclFloat32;
  constexpr size_t kBytes = 4;  // float and int32 alike
  const auto* from = static_cast<const char*>(send);
  auto* to = static_cast<char*>(recv);
  GroupErrors errors;
  auto note = [&](ncclResult_t r, const char* call) { errors.note(r, call); };
  cudaError_t copy = cudaSuccess;
  size_t moved = 0;
  note(ncclGroupStart(), "ncclGroupStart");
  for (const PeerTransfer& t : *plan) {
    moved += t.send_count;
    if (t.peer == rank_) {
      if (t.send_count > 0 && copy == cudaSuccess)
        copy = cudaMemcpyAsync(to + t.recv_offset * kBytes, from + t.send_offset * kBytes, t.send_count * kBytes,
                               cudaMemcpyDeviceToDevice, stream);
      continue;
    }
    if (t.send_count > 0) note(ncclSend(from + t.send_offset * kBytes, t.send_count, type, t.peer, c, stream), "ncclSend");
    if (t.recv_count > 0) note(ncclRecv(to + t.recv_offset * kBytes, t.recv_count, type, t.peer, c, stream), "ncclRecv");
  }
  note(ncclGroupEnd(), "ncclGroupEnd");
  errors.raise();
  if (copy != cudaSuccess) throw_cuda_error(copy, "cudaMemcpyAsync (the all-to-all's self transfer)", __FILE__, __LINE__);
  wait("all-to-all sending " + std::to_string(moved) + (ints ? " ints" : " floats"), stream);
}
#else
bool NcclComm::available() { return false; }
std::vector<uint8_t> NcclComm::unique_id() { throw CudaError("this build of troupe has no NCCL"); }
NcclComm::NcclComm(const std::vector<uint8_t>&, int, int) { throw CudaError("this build of troupe has no NCCL"); }
NcclComm::~NcclComm() = default;
void NcclComm::wait(const std::string&, cudaStream_t) {}
void NcclComm::all_reduce_sum(float*, size_t, cudaStream_t) {}
void NcclComm::broadcast(float*, size_t, int, cudaStream_t) {}
size_t NcclComm::check_bounds(std::span<const size_t>, const char*) const { return 0; }
void NcclComm::reduce_scatter_sum(float*, std::span<const size_t>, cudaStream_t) {}
void NcclComm::all_gather(float*, std::span<const size_t>, cudaStream_t) {}
void NcclComm::all_to_all_v(const void*, const size_t*, void*, const size_t*, bool, cudaStream_t) {}
#endif

}  // namespace troupe::kernels::cuda
