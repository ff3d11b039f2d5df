// The learner ranks' device collectives (communicator.h): rank 0's collective id (or its failure)
// broadcast over a host communicator (share_collective_id, broadcast_collective_id), the learners'
// collective on their model's device bootstrapped with it (join_device_collective), and the one
// staged through host copies over a host communicator (staged_device_collective).
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/learner/communicator.h"

namespace troupe::learner {

Result<std::vector<uint8_t>> share_collective_id(const Result<std::vector<uint8_t>>& made, Communicator& comm) {
  const bool root = comm.rank() == 0;
  if (comm.size() <= 1) return made;
  // As floats: its length first (-1: rank 0 failed), then its bytes (MPI moves the bits as they are).
  float len = !root ? 0.0f : made.ok() ? static_cast<float>(made->size()) : -1.0f;
  TROUPE_TRY(comm.broadcast(std::span<float>(&len, 1), 0));
  if (len < 0)
    return root ? made
                : make_error(ErrorCode::internal, "rank 0 of " + std::to_string(comm.size()) +
                                                      " could not make the collective id (its log says why)");
  if (len == 0) return std::vector<uint8_t>();
  const size_t n = static_cast<size_t>(len);
  std::vector<float> words((n + sizeof(float) - 1) / sizeof(float), 0.0f);
  if (root) std::memcpy(words.data(), made->data(), n);
  TROUPE_TRY(comm.broadcast(std::span<float>(words), 0));
  std::vector<uint8_t> id(n);
  std::memcpy(id.data(), words.data(), n);
  return id;
}

Result<std::vector<uint8_t>> broadcast_collective_id(const kernels::Backend& backend, Communicator& comm) {
  Result<std::vector<uint8_t>> made = std::vector<uint8_t>();
  if (comm.rank() == 0) {
    try {
      made = backend.collective_id();
    } catch (const std::exception& e) {
      made = make_error(ErrorCode::internal,
                        std::string(backend.name()) + " backend: making the collective id: " + e.what());
    }
  }
  return share_collective_id(made, comm);
}

Result<std::unique_ptr<kernels::DeviceCollective>> join_device_collective(const kernels::Backend& backend,
                                                                          Communicator& comm) {
  if (comm.size() <= 1) return std::unique_ptr<kernels::DeviceCollective>();
  TROUPE_ASSIGN_OR_RETURN(const auto id, broadcast_collective_id(backend, comm));
  if (id.empty()) return std::unique_ptr<kernels::DeviceCollective>();  // no device collectives: host all-reduce
  return backend.join_collective(id, comm.size(), comm.rank());
}

namespace {

class StagedCollective final : public kernels::DeviceCollective {
 public:
  StagedCollective(const kernels::Backend& b, Communicator& comm) : b_(b), comm_(comm) {}
  void all_reduce_sum(float* buf, size_t n) override {
    down(buf, 0, n);
    check(comm_.allreduce_sum(std::span<float>(host_.data(), n)), "all-reduce");
    up(buf, 0, n);
  }
  void broadcast(float* buf, size_t n, int root) override {
    if (comm_.rank() == root) down(buf, 0, n);
    else host_.resize(n);
    check(comm_.broadcast(std::span<float>(host_.data(), n), root), "broadcast");
    if (comm_.rank() != root) up(buf, 0, n);
  }
  void reduce_scatter_sum(float* buf, std::span<const size_t> bounds) override {
    const auto [lo, hi] = mine(bounds);
    down(buf, 0, bounds.back());
    check(comm_.reduce_scatter_sum(std::span<float>(host_.data(), bounds.back()), bounds), "reduce-scatter");
    up(buf, lo, hi);
  }
  void all_gather(float* buf, std::span<const size_t> bounds) override {
    const auto [lo, hi] = mine(bounds);
    host_.resize(bounds.back());
    b_.copy_device_to_host(host_.data() + lo, buf + lo, (hi - lo) * sizeof(float));
    check(comm_.all_gather(std::span<float>(host_.data(), bounds.back()), bounds), "all-gather");
    up(buf, 0, bounds.back());
  }

 private:
  void down(const float* buf, size_t lo, size_t hi) {
    host_.resize(hi);
    b_.copy_device_to_host(host_.data() + lo, buf + lo, (hi - lo) * sizeof(float));
  }
  void up(float* buf, size_t lo, size_t hi) { b_.copy_host_to_device(buf + lo, host_.data() + lo, (hi - lo) * sizeof(float)); }
  std::pair<size_t, size_t> mine(std::span<const size_t> bounds) const {
    if (bounds.size() != static_cast<size_t>(comm_.size()) + 1)
      throw std::runtime_error("staged collective: " + std::to_string(bounds.size()) + " shard bounds for " +
                               std::to_string(comm_.size()) + " ranks");
    return {bounds[static_cast<size_t>(comm_.rank())], bounds[static_cast<size_t>(comm_.rank()) + 1]};
  }
  static void check(const Status& st, const char* what) {
    if (!st.ok()) throw std::runtime_error(std::string("staged ") + what + ": " + st.error().message);
  }
  const kernels::Backend& b_;
  Communicator& comm_;
  std::vector<float> host_;  // the staging copy, kept between calls
};

}  // namespace

std::unique_ptr<kernels::DeviceCollective> staged_device_collective(const kernels::Backend& backend, Communicator& comm) {
  return std::make_unique<StagedCollective>(backend, comm);
}

}  // namespace troupe::learner
