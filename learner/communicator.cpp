// MPI communicator: MPI_Allreduce in place on the flat buffer, chunked below INT_MAX elements.
// The communicator is a duplicate with MPI_ERRORS_RETURN, so a failing rank becomes a Status.
#include "troupe/learner/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <string>

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
    TROUPE_MPI_CHECK(MPI_Barrier(comm_));
    return {};
  }
  Status broadcast(std::span<float> buf, int root) override {
    size_t done = 0;
    while (done < buf.size()) {
      const int n = static_cast<int>(std::min<size_t>(buf.size() - done, INT_MAX / 2));
      TROUPE_MPI_CHECK(MPI_Bcast(buf.data() + done, n, MPI_FLOAT, root, comm_));
      done += static_cast<size_t>(n);
    }
    return {};
  }

 private:
  template <class T>
  Status reduce(T* data, size_t count, MPI_Datatype type) {
    if (size_ == 1) return {};
    size_t done = 0;
    while (done < count) {
      const int n = static_cast<int>(std::min<size_t>(count - done, INT_MAX / 2));
      TROUPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, n, type, MPI_SUM, comm_));
      done += static_cast<size_t>(n);
    }
    return {};
  }
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

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

}  // namespace troupe::learner
