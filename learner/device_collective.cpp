// The learner ranks' device collectives (communicator.h): rank 0's collective id broadcast over a
// host communicator (broadcast_collective_id), and the learners' collective on their model's device
// bootstrapped with it (join_device_collective).
#include <cstring>
#include <exception>
#include <string>

#include "troupe/learner/communicator.h"

namespace troupe::learner {

Result<std::vector<uint8_t>> broadcast_collective_id(const kernels::Backend& backend, Communicator& comm) {
  std::vector<uint8_t> id;
  if (comm.rank() == 0) {
    try {
      id = backend.collective_id();
    } catch (const std::exception& e) {
      return make_error(ErrorCode::internal, std::string(backend.name()) + " backend: making the collective id: " +
                                                 e.what());
    }
  }
  if (comm.size() <= 1) return id;
  // Broadcast as floats: its length first, then its bytes (MPI moves the bits as they are).
  float len = static_cast<float>(id.size());
  TROUPE_TRY(comm.broadcast(std::span<float>(&len, 1), 0));
  if (len <= 0) return std::vector<uint8_t>();
  const size_t n = static_cast<size_t>(len);
  std::vector<float> words((n + sizeof(float) - 1) / sizeof(float), 0.0f);
  if (comm.rank() == 0) std::memcpy(words.data(), id.data(), n);
  TROUPE_TRY(comm.broadcast(std::span<float>(words), 0));
  id.resize(n);
  std::memcpy(id.data(), words.data(), n);
  return id;
}

Result<std::unique_ptr<kernels::DeviceCollective>> join_device_collective(const kernels::Backend& backend,
                                                                          Communicator& comm) {
  if (comm.size() <= 1) return std::unique_ptr<kernels::DeviceCollective>();
  TROUPE_ASSIGN_OR_RETURN(const auto id, broadcast_collective_id(backend, comm));
  if (id.empty()) return std::unique_ptr<kernels::DeviceCollective>();  // no device collectives: host all-reduce
  return backend.join_collective(id, comm.size(), comm.rank());
}

}  // namespace troupe::learner
