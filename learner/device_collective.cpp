// The learner ranks' device collectives (communicator.h): rank 0's collective id (or its failure)
// broadcast over a host communicator (share_collective_id, broadcast_collective_id), and the learners' collective on their model's device
// bootstrapped with it (join_device_collective).
#include <cstring>
#include <exception>
#include <string>

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

}  // namespace troupe::learner
