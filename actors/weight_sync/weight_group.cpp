// The weight group (troupe/actors/weight_group.h).
#include "troupe/actors/weight_group.h"

#include <exception>
#include <string>

#include "troupe/kernels/local_collective.h"

namespace troupe::actors {
namespace {
constexpr std::uint8_t kNccl = 'N', kLocal = 'L';
}  // namespace

Result<std::vector<std::uint8_t>> WeightGroup::make_id(const kernels::Backend& backend) {
  std::vector<std::uint8_t> inner;
  try {
    inner = backend.collective_id();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, std::string("weight group: ") + std::string(backend.name()) +
                                               " backend: making the collective id: " + e.what());
  }
  std::vector<std::uint8_t> id{inner.empty() ? kLocal : kNccl};
  if (inner.empty()) inner = kernels::local_collective_id();
  id.insert(id.end(), inner.begin(), inner.end());
  return id;
}

Result<std::unique_ptr<WeightGroup>> WeightGroup::join(const kernels::Backend& backend,
                                                       const std::vector<std::uint8_t>& id, int nranks, int rank) {
  if (id.empty() || (id[0] != kNccl && id[0] != kLocal))
    return make_error(ErrorCode::invalid_input, "weight group: a malformed group id (" + std::to_string(id.size()) +
                                                    " bytes)");
  const std::vector<std::uint8_t> inner(id.begin() + 1, id.end());
  Result<std::unique_ptr<kernels::DeviceCollective>> c =
      id[0] == kNccl ? backend.join_collective(inner, nranks, rank)
                     : kernels::join_local_collective(backend, inner, nranks, rank);
  if (!c.ok())
    return make_error(c.error().code, "weight group: rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                                          " could not join: " + c.error().message);
  return std::unique_ptr<WeightGroup>(new WeightGroup(backend, std::move(c).value(), nranks, rank));
}

WeightGroup::~WeightGroup() = default;

Result<float*> WeightGroup::staging(size_t n) {
  if (Status st = backend_.grow(staging_, n * sizeof(float)); !st.ok())
    return make_error(st.error().code, "weight group: the broadcast buffer of " + std::to_string(n) + " values: " +
                                           st.error().message);
  return staging_.floats();
}

Status WeightGroup::send(std::span<const float> values) {
  TROUPE_ASSIGN_OR_RETURN(float* buf, staging(values.size()));
  try {
    backend_.copy_host_to_device(buf, values.data(), values.size_bytes());
    collective_->broadcast(buf, values.size(), 0);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, std::string("weight group: learner 0's broadcast of ") +
                                               std::to_string(values.size()) + " values: " + e.what());
  }
  return {};
}

Status WeightGroup::receive(std::span<float> out) {
  TROUPE_ASSIGN_OR_RETURN(float* buf, staging(out.size()));
  try {
    collective_->broadcast(buf, out.size(), 0);
    backend_.copy_device_to_host(out.data(), buf, out.size_bytes());
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "weight group: rank " + std::to_string(rank_) + " receiving " +
                                               std::to_string(out.size()) + " values: " + e.what());
  }
  return {};
}

}  // namespace troupe::actors
