// The weight group (troupe/actors/weight_group.h).
#include "troupe/actors/weight_group.h"

#include <cstring>
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

size_t WeightGroup::staged_bytes(size_t n, WeightDtype dtype) {
  return dtype == WeightDtype::bf16 ? sizeof(float) * ((n + 1) / 2) : sizeof(float) * n;
}

Result<float*> WeightGroup::staging(size_t floats) {
  if (Status st = backend_.grow(staging_, floats * sizeof(float)); !st.ok())
    return make_error(st.error().code, "weight group: the broadcast buffer of " + std::to_string(floats) +
                                           " floats: " + st.error().message);
  return staging_.floats();
}

Status WeightGroup::send(std::span<const float> values, WeightDtype dtype) {
  const size_t floats = staged_bytes(values.size(), dtype) / sizeof(float);
  TROUPE_ASSIGN_OR_RETURN(float* buf, staging(floats));
  const void* src = values.data();
  if (dtype == WeightDtype::bf16) {  // the top half of each value (its low half is zero: bf16 already)
    words_.assign(2 * floats, 0);
    for (size_t i = 0; i < values.size(); ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, &values[i], sizeof bits);
      words_[i] = static_cast<std::uint16_t>(bits >> 16);
    }
    src = words_.data();
  }
  try {
    backend_.copy_host_to_device(buf, src, floats * sizeof(float));
    collective_->broadcast(buf, floats, 0);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, std::string("weight group: learner 0's broadcast of ") +
                                               std::to_string(values.size()) + " values: " + e.what());
  }
  return {};
}

Status WeightGroup::receive(std::span<float> out, WeightDtype dtype) {
  const size_t floats = staged_bytes(out.size(), dtype) / sizeof(float);
  TROUPE_ASSIGN_OR_RETURN(float* buf, staging(floats));
  try {
    collective_->broadcast(buf, floats, 0);
    if (dtype == WeightDtype::bf16) {
      words_.resize(2 * floats);
      backend_.copy_device_to_host(words_.data(), buf, floats * sizeof(float));
      for (size_t i = 0; i < out.size(); ++i) {
        const std::uint32_t bits = static_cast<std::uint32_t>(words_[i]) << 16;
        std::memcpy(&out[i], &bits, sizeof bits);
      }
    } else {
      backend_.copy_device_to_host(out.data(), buf, out.size_bytes());
    }
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "weight group: rank " + std::to_string(rank_) + " receiving " +
                                               std::to_string(out.size()) + " values: " + e.what());
  }
  return {};
}

}  // namespace troupe::actors
