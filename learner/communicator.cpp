// MPI communicator: MPI_Allreduce in place on the flat buffer, chunked below INT_MAX elements, and
// the sharded learners' collectives (reduce-scatter summed in rank order, all-gather, chain). The
// communicator is a duplicate with MPI_ERRORS_RETURN, so a failing rank becomes a Status.
#include "troupe/learner/communicator.h"

#include "troupe/base/blocking_call.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace troupe::learner {

namespace {

Status mpi_check(int rc, const char* what, const char* file, int line) {
  if (rc == MPI_SUCCESS) return {};
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return make_error(ErrorCode::peer_failed, std::string("learner: ") + what + " failed at " + file + ":" +
                                                std::to_string(line) + ": " + std::string(msg, len));
}
#define TROUPE_MPI_CHECK(call) TROUPE_TRY(mpi_check((call), #call, __FILE__, __LINE__))

// Values per rank per round of the reduce-scatter: the scratch it receives into is ranks x this.
constexpr size_t kScatterChunk = size_t{1} << 20;

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm c) : comm_(c) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status allreduce_sum(std::span<float> buf) override { return reduce(buf.data(), buf.size(), MPI_FLOAT); }
  Status allreduce_sum(std::span<double> buf) override { return reduce(buf.data(), buf.size(), MPI_DOUBLE); }
  Status barrier() override {
    const BlockingCall label("MPI_Barrier (the learners' barrier)");
    TROUPE_MPI_CHECK(MPI_Barrier(comm_));
    return {};
  }
  Status broadcast(std::span<float> buf, int root) override {
    size_t done = 0;
    while (done < buf.size()) {
      const int n = static_cast<int>(std::min<size_t>(buf.size() - done, INT_MAX / 2));
      const BlockingCall label("MPI_Bcast (a broadcast among the learners)");
      TROUPE_MPI_CHECK(MPI_Bcast(buf.data() + done, n, MPI_FLOAT, root, comm_));
      done += static_cast<size_t>(n);
    }
    return {};
  }
  Status reduce_scatter_sum(std::span<float> buf, std::span<const size_t> bounds) override;
  Status all_gather(std::span<float> buf, std::span<const size_t> bounds) override;
  Result<std::unique_ptr<PendingCollective>> start_all_gather(std::span<float> buf,
                                                              std::span<const size_t> bounds) override;
  Result<std::unique_ptr<PendingCollective>> start_reduce_scatter_sum(std::span<float> buf,
                                                                      std::span<const size_t> bounds) override;
  Status gather(std::span<float> buf, std::span<const size_t> bounds, int root) override;
  Result<double> chain(const std::function<double(double)>& step) override;
  Result<std::unique_ptr<Communicator>> split(int color, int key) override;
  Status alltoallv(const float* send, const size_t* send_counts, float* recv, const size_t* recv_counts) override;
  Status alltoall_ints(const int32_t* send, int32_t* recv, int n) override;

 private:
  template <class T>
  Status reduce(T* data, size_t count, MPI_Datatype type) {
    if (size_ == 1) return {};
    size_t done = 0;
    while (done < count) {
      const int n = static_cast<int>(std::min<size_t>(count - done, INT_MAX / 2));
      const BlockingCall label("MPI_Allreduce (the learners' gradient all-reduce)");
      TROUPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, n, type, MPI_SUM, comm_));
      done += static_cast<size_t>(n);
    }
    return {};
  }
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

// Rounds of at most kScatterChunk values of every shard: each rank sends the round's part of shard
// j to rank j (MPI_Alltoallv), and adds what it received in rank order.
Status MpiCommunicator::reduce_scatter_sum(std::span<float> buf, std::span<const size_t> bounds) {
  if (size_ == 1) return {};
  const auto P = static_cast<size_t>(size_);
  size_t longest = 0;
  for (size_t j = 0; j < P; ++j) longest = std::max(longest, bounds[j + 1] - bounds[j]);
  const size_t lo = bounds[static_cast<size_t>(rank_)], hi = bounds[static_cast<size_t>(rank_) + 1];
  std::vector<float> scratch(P * std::min(longest, kScatterChunk));
  std::vector<int> scount(P), sdispl(P), rcount(P), rdispl(P);
  std::vector<float> sendbuf;
  for (size_t off = 0; off < longest; off += kScatterChunk) {
    const size_t mine = hi - lo > off ? std::min(kScatterChunk, hi - lo - off) : 0;
    for (size_t j = 0; j < P; ++j) {
      const size_t len = bounds[j + 1] - bounds[j];
      scount[j] = static_cast<int>(len > off ? std::min(kScatterChunk, len - off) : 0);
      rcount[j] = static_cast<int>(mine);
      rdispl[j] = static_cast<int>(j * mine);
    }
    // Alltoallv's displacements are ints: a buffer that fits sends from itself, a larger one
    // through a copy of this round's parts.
    const float* from = buf.data();
    if (buf.size() <= static_cast<size_t>(INT_MAX)) {
      for (size_t j = 0; j < P; ++j) sdispl[j] = static_cast<int>(bounds[j] + off);
    } else {
      size_t total = 0;
      for (size_t j = 0; j < P; ++j) total += static_cast<size_t>(scount[j]);
      sendbuf.resize(total);
      size_t at = 0;
      for (size_t j = 0; j < P; ++j) {
        sdispl[j] = static_cast<int>(at);
        std::copy_n(buf.data() + bounds[j] + off, scount[j], sendbuf.data() + at);
        at += static_cast<size_t>(scount[j]);
      }
      from = sendbuf.data();
    }
    const BlockingCall label("MPI_Alltoallv (the learners' gradient reduce-scatter)");
    TROUPE_MPI_CHECK(MPI_Alltoallv(from, scount.data(), sdispl.data(), MPI_FLOAT, scratch.data(),
                                   rcount.data(), rdispl.data(), MPI_FLOAT, comm_));
    float* out = buf.data() + lo + off;
    for (size_t i = 0; i < mine; ++i) {
      float acc = scratch[i];
      for (size_t j = 1; j < P; ++j) acc += scratch[j * mine + i];
      out[i] = acc;
    }
  }
  return {};
}

Status MpiCommunicator::all_gather(std::span<float> buf, std::span<const size_t> bounds) {
  if (size_ == 1) return {};
  const auto P = static_cast<size_t>(size_);
  if (buf.size() > static_cast<size_t>(INT_MAX))
    return invalid_input("learner: all_gather of " + std::to_string(buf.size()) + " values (at most INT_MAX)");
  std::vector<int> count(P), displ(P);
  for (size_t j = 0; j < P; ++j) {
    count[j] = static_cast<int>(bounds[j + 1] - bounds[j]);
    displ[j] = static_cast<int>(bounds[j]);
  }
  const BlockingCall label("MPI_Allgatherv (the learners' all-gather)");
  TROUPE_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data(), count.data(), displ.data(),
                                  MPI_FLOAT, comm_));
  return {};
}

// One started MPI collective with the arrays it reads until it completes (MPI's rule for
// non-blocking collectives) and what to do once it has (the reduce-scatter's rank-ordered sum).
class MpiPending final : public PendingCollective {
 public:
  MpiPending(const char* what, size_t ranks) : count(ranks), displ(ranks), rcount(ranks), rdispl(ranks), what_(what) {}
  ~MpiPending() override {
    if (!done_) (void)wait();
  }
  Status wait() override {
    if (done_) return {};
    done_ = true;
    const BlockingCall label(what_);
    TROUPE_TRY(mpi_check(MPI_Wait(&req, MPI_STATUS_IGNORE), what_, __FILE__, __LINE__));
    if (finish) finish();
    return {};
  }
  Result<bool> test() override {
    if (done_) return true;
    int flag = 0;
    TROUPE_TRY(mpi_check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), what_, __FILE__, __LINE__));
    if (flag) {
      done_ = true;
      if (finish) finish();
    }
    return done_;
  }

  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<int> count, displ, rcount, rdispl;
  std::vector<float> scratch;
  std::function<void()> finish;

 private:
  const char* what_;
  bool done_ = false;
};

// A finished handle (the blocking call already ran).
class DonePending final : public PendingCollective {
 public:
  Status wait() override { return {}; }
  Result<bool> test() override { return true; }
};

Result<std::unique_ptr<PendingCollective>> MpiCommunicator::start_all_gather(std::span<float> buf,
                                                                             std::span<const size_t> bounds) {
  if (size_ == 1 || buf.size() > static_cast<size_t>(INT_MAX)) {
    TROUPE_TRY(all_gather(buf, bounds));
    return std::unique_ptr<PendingCollective>(new DonePending);
  }
  const auto P = static_cast<size_t>(size_);
  auto op = std::make_unique<MpiPending>("MPI_Iallgatherv (learner.shard parameters: a layer's gather)", P);
  for (size_t j = 0; j < P; ++j) {
    op->count[j] = static_cast<int>(bounds[j + 1] - bounds[j]);
    op->displ[j] = static_cast<int>(bounds[j]);
  }
  TROUPE_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data(), op->count.data(),
                                   op->displ.data(), MPI_FLOAT, comm_, &op->req));
  return std::unique_ptr<PendingCollective>(std::move(op));
}

// One MPI_Ialltoallv of every shard's part to its owner; wait() adds what arrived in rank order (the
// blocking call's sums). A buffer past INT_MAX values or a shard past kScatterChunk x 16 values
// takes the blocking rounds.
Result<std::unique_ptr<PendingCollective>> MpiCommunicator::start_reduce_scatter_sum(
    std::span<float> buf, std::span<const size_t> bounds) {
  const auto P = static_cast<size_t>(size_);
  size_t longest = 0;
  for (size_t j = 0; j < P; ++j) longest = std::max(longest, bounds[j + 1] - bounds[j]);
  if (size_ == 1 || buf.size() > static_cast<size_t>(INT_MAX) || longest > 16 * kScatterChunk) {
    TROUPE_TRY(reduce_scatter_sum(buf, bounds));
    return std::unique_ptr<PendingCollective>(new DonePending);
  }
  const size_t lo = bounds[static_cast<size_t>(rank_)], mine = bounds[static_cast<size_t>(rank_) + 1] - lo;
  auto op = std::make_unique<MpiPending>("MPI_Ialltoallv (learner.shard: a layer's gradient reduce-scatter)", P);
  op->scratch.resize(P * mine);
  for (size_t j = 0; j < P; ++j) {
    op->count[j] = static_cast<int>(bounds[j + 1] - bounds[j]);
    op->displ[j] = static_cast<int>(bounds[j]);
    op->rcount[j] = static_cast<int>(mine);
    op->rdispl[j] = static_cast<int>(j * mine);
  }
  MpiPending* raw = op.get();
  op->finish = [raw, out = buf.data() + lo, mine, P] {
    const float* in = raw->scratch.data();
    for (size_t i = 0; i < mine; ++i) {
      float acc = in[i];
      for (size_t j = 1; j < P; ++j) acc += in[j * mine + i];
      out[i] = acc;
    }
  };
  TROUPE_MPI_CHECK(MPI_Ialltoallv(buf.data(), op->count.data(), op->displ.data(), MPI_FLOAT, op->scratch.data(),
                                  op->rcount.data(), op->rdispl.data(), MPI_FLOAT, comm_, &op->req));
  return std::unique_ptr<PendingCollective>(std::move(op));
}

Status MpiCommunicator::gather(std::span<float> buf, std::span<const size_t> bounds, int root) {
  if (size_ == 1) return {};
  const auto P = static_cast<size_t>(size_);
  if (buf.size() > static_cast<size_t>(INT_MAX))
    return invalid_input("learner: gather of " + std::to_string(buf.size()) + " values (at most INT_MAX)");
  std::vector<int> count(P), displ(P);
  for (size_t j = 0; j < P; ++j) {
    count[j] = static_cast<int>(bounds[j + 1] - bounds[j]);
    displ[j] = static_cast<int>(bounds[j]);
  }
  const auto r = static_cast<size_t>(rank_);
  const BlockingCall label("MPI_Gatherv (a gather to one learner)");
  if (rank_ == root) {
    TROUPE_MPI_CHECK(MPI_Gatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf.data(), count.data(), displ.data(), MPI_FLOAT,
                                 root, comm_));
  } else {
    TROUPE_MPI_CHECK(MPI_Gatherv(buf.data() + bounds[r], count[r], MPI_FLOAT, nullptr, nullptr, nullptr, MPI_FLOAT,
                                 root, comm_));
  }
  return {};
}

Result<double> MpiCommunicator::chain(const std::function<double(double)>& step) {
  double carry = 0.0;
  const BlockingCall label("MPI_Recv/MPI_Send/MPI_Bcast (the gradient norm's chain through the learners)");
  if (rank_ > 0) TROUPE_MPI_CHECK(MPI_Recv(&carry, 1, MPI_DOUBLE, rank_ - 1, 0, comm_, MPI_STATUS_IGNORE));
  carry = step(carry);
  if (rank_ + 1 < size_) TROUPE_MPI_CHECK(MPI_Send(&carry, 1, MPI_DOUBLE, rank_ + 1, 0, comm_));
  TROUPE_MPI_CHECK(MPI_Bcast(&carry, 1, MPI_DOUBLE, size_ - 1, comm_));
  return carry;
}

Result<std::unique_ptr<Communicator>> MpiCommunicator::split(int color, int key) {
  MPI_Comm part;
  TROUPE_MPI_CHECK(MPI_Comm_split(comm_, color, key, &part));
  MPI_Comm_set_errhandler(part, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(part));
}

// Counts and displacements are ints in MPI: an exchange of more than INT_MAX floats is refused.
Status MpiCommunicator::alltoallv(const float* send, const size_t* send_counts, float* recv,
                                  const size_t* recv_counts) {
  const auto P = static_cast<size_t>(size_);
  std::vector<int> scount(P), sdispl(P), rcount(P), rdispl(P);
  size_t s_at = 0, r_at = 0;
  for (size_t j = 0; j < P; ++j) {
    if (s_at + send_counts[j] > static_cast<size_t>(INT_MAX) || r_at + recv_counts[j] > static_cast<size_t>(INT_MAX))
      return invalid_input("learner: an expert-parallel all-to-all of more than INT_MAX floats");
    scount[j] = static_cast<int>(send_counts[j]), sdispl[j] = static_cast<int>(s_at);
    rcount[j] = static_cast<int>(recv_counts[j]), rdispl[j] = static_cast<int>(r_at);
    s_at += send_counts[j], r_at += recv_counts[j];
  }
  const BlockingCall label("MPI_Alltoallv (the expert-parallel token exchange)");
  TROUPE_MPI_CHECK(MPI_Alltoallv(send, scount.data(), sdispl.data(), MPI_FLOAT, recv, rcount.data(), rdispl.data(),
                                 MPI_FLOAT, comm_));
  return {};
}

Status MpiCommunicator::alltoall_ints(const int32_t* send, int32_t* recv, int n) {
  const BlockingCall label("MPI_Alltoall (the expert-parallel row counts)");
  TROUPE_MPI_CHECK(MPI_Alltoall(send, n, MPI_INT32_T, recv, n, MPI_INT32_T, comm_));
  return {};
}

}  // namespace

Result<std::unique_ptr<Communicator>> make_mpi_communicator(void* mpi_comm) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return make_error(ErrorCode::internal, "learner: make_mpi_communicator called before MPI_Init");
  MPI_Comm base = mpi_comm ? *static_cast<MPI_Comm*>(mpi_comm) : MPI_COMM_WORLD;
  MPI_Comm dup;
  TROUPE_MPI_CHECK(MPI_Comm_dup(base, &dup));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(dup));
}

Status Communicator::reduce_scatter_sum(std::span<float> buf, std::span<const size_t>) {
  if (size() == 1) return {};
  return allreduce_sum(buf);  // (a communicator of its own: its sum's order is its own)
}

Status Communicator::ordered_allreduce_sum(std::span<float> buf, std::span<const size_t> bounds) {
  TROUPE_TRY(reduce_scatter_sum(buf, bounds));
  return all_gather(buf, bounds);
}

Status Communicator::all_gather(std::span<float>, std::span<const size_t>) {
  if (size() == 1) return {};
  return invalid_input("learner: this communicator has no all_gather");
}

Result<std::unique_ptr<PendingCollective>> Communicator::start_all_gather(std::span<float> buf,
                                                                          std::span<const size_t> bounds) {
  TROUPE_TRY(all_gather(buf, bounds));
  return std::unique_ptr<PendingCollective>(new DonePending);
}

Result<std::unique_ptr<PendingCollective>> Communicator::start_reduce_scatter_sum(std::span<float> buf,
                                                                                  std::span<const size_t> bounds) {
  TROUPE_TRY(reduce_scatter_sum(buf, bounds));
  return std::unique_ptr<PendingCollective>(new DonePending);
}

Status Communicator::gather(std::span<float> buf, std::span<const size_t> bounds, int) {
  return all_gather(buf, bounds);  // (more than the root needs)
}

Result<double> Communicator::chain(const std::function<double(double)>& step) {
  if (size() == 1) return step(0.0);
  return invalid_input("learner: this communicator has no chain");
}

Result<std::unique_ptr<Communicator>> Communicator::split(int, int) {
  if (size() == 1) return std::unique_ptr<Communicator>(new LocalCommunicator);
  return invalid_input("learner: this communicator cannot split (expert parallelism needs MPI)");
}

Status Communicator::alltoallv(const float* send, const size_t* send_counts, float* recv, const size_t*) {
  if (size() != 1) return invalid_input("learner: this communicator has no all-to-all (expert parallelism needs MPI)");
  if (send_counts[0] > 0) std::copy_n(send, send_counts[0], recv);
  return {};
}

Status Communicator::alltoall_ints(const int32_t* send, int32_t* recv, int n) {
  if (size() != 1) return invalid_input("learner: this communicator has no all-to-all (expert parallelism needs MPI)");
  std::copy_n(send, n, recv);
  return {};
}

std::vector<size_t> shard_bounds(size_t n, int ranks) {
  const auto P = static_cast<size_t>(std::max(ranks, 1));
  size_t per = (n + P - 1) / P;
  per = (per + 15) / 16 * 16;
  std::vector<size_t> b(P + 1);
  for (size_t j = 0; j <= P; ++j) b[j] = std::min(n, j * per);
  b[P] = n;
  return b;
}

}  // namespace troupe::learner
