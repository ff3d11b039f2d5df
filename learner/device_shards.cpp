// DeviceParamShards (device_shards.h): ParamShards' memory and collectives on a device model's
// sparse arena and the learners' device collective.
#include "troupe/learner/device_shards.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <string>

namespace troupe::learner {

namespace {

// A collective that already ran (the device collective blocks): nothing is left to wait for.
class Finished final : public PendingCollective {
 public:
  Status wait() override { return {}; }
  Result<bool> test() override { return true; }
};

constexpr float kDropped = std::numeric_limits<float>::quiet_NaN();

}  // namespace

Result<std::unique_ptr<DeviceParamShards>> DeviceParamShards::create(PolicyModel& model, std::vector<size_t> bounds,
                                                                     Communicator& comm,
                                                                     kernels::DeviceCollective& collective) {
  const size_t g = model.backend().sparse_granularity();
  if (g == 0 || g % sizeof(float) != 0)
    return invalid_input("learner.shard parameters: the " + std::string(model.backend().name()) +
                         " backend has no sparse buffers to map the layers into");
  TROUPE_TRY(model.make_train_arena_sparse());
  return std::unique_ptr<DeviceParamShards>(new DeviceParamShards(model, std::move(bounds), comm, collective));
}

DeviceParamShards::DeviceParamShards(PolicyModel& model, std::vector<size_t> bounds, Communicator& comm,
                                     kernels::DeviceCollective& collective)
    : ParamShards({}, {}, model.tensors(), std::move(bounds), comm, /*layered=*/true, /*pools=*/false),
      model_(model),
      be_(model.backend()),
      dc_(collective),
      granule_(be_.sparse_granularity() / sizeof(float)),
      n_(this->bounds().back()) {
  set_prefetch(false);
}

std::vector<std::pair<size_t, size_t>> DeviceParamShards::outside(size_t k) const {
  const auto& r = ranges()[k];
  std::vector<std::pair<size_t, size_t>> out;
  if (r.begin < std::min(r.end, lo_)) out.emplace_back(r.begin, std::min(r.end, lo_));
  if (std::max(r.begin, hi_) < r.end) out.emplace_back(std::max(r.begin, hi_), r.end);
  return out;
}

std::pair<size_t, size_t> DeviceParamShards::inner(std::pair<size_t, size_t> part) const {
  const size_t s = (part.first + granule_ - 1) / granule_ * granule_;
  const size_t e = part.second == n_ ? n_ : part.second / granule_ * granule_;  // (the arena's end closes its last granule)
  return e > s ? std::pair{s, e} : std::pair{s, s};
}

Status DeviceParamShards::map(bool grads, size_t k, bool on) {
  for (const auto& part : outside(k)) {
    const auto [s, e] = inner(part);
    if (e > s) TROUPE_TRY(model_.map_train_arena(grads, s, e, on));
  }
  return {};
}

void DeviceParamShards::fill_edges(bool grads, size_t k, float value) {
  const auto a = arena();
  float* base = grads ? a.grads : a.params;
  for (const auto& [b, e] : outside(k)) {
    const auto [s, f] = inner({b, e});
    if (f > s) {
      if (s > b) be_.fill(base + b, s - b, value);
      if (e > f) be_.fill(base + f, e - f, value);
    } else {
      be_.fill(base + b, e - b, value);
    }
  }
}

policy::Model::DeviceArena DeviceParamShards::arena() { return model_.device_train_arena(); }

template <class F>
Status DeviceParamShards::collective(const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, std::string("learner.shard parameters on the device: ") + what + ": " + e.what());
  }
  return {};
}

Status DeviceParamShards::bring_in(size_t k) { return map(false, k, true); }

Status DeviceParamShards::drop_params(size_t k) {
  TROUPE_TRY(map(false, k, false));
  fill_edges(false, k, kDropped);
  return {};
}

Status DeviceParamShards::grads_range_in(size_t k) {
  TROUPE_TRY(map(true, k, true));
  float* g = arena().grads;
  for (const auto& part : outside(k)) {  // (newly mapped memory holds anything; the edges were zeroed with the shard)
    const auto [s, e] = inner(part);
    if (e > s) be_.zero(g + s, e - s);
  }
  return {};
}

Status DeviceParamShards::drop_grads(size_t k) {
  TROUPE_TRY(map(true, k, false));
  fill_edges(true, k, kDropped);
  return {};
}

// The embedding's gradient stays mapped through the accumulation: its backward runs after every
// layer's, with no hook call before it (host pages fault in on their own; a device's must be there).
Status DeviceParamShards::zero_grad_memory() {
  for (size_t k = 0; k < ranges().size(); ++k) TROUPE_TRY(embedding_range(k) ? grads_range_in(k) : map(true, k, false));
  for (size_t k = 0; k < ranges().size(); ++k) fill_edges(true, k, 0.0f);
  if (hi_ > lo_) be_.zero(arena().grads + lo_, hi_ - lo_);
  return {};
}

Status DeviceParamShards::grads_whole() {
  for (size_t k = 0; k < ranges().size(); ++k) TROUPE_TRY(grads_range_in(k));
  return {};
}

Status DeviceParamShards::gather_range(size_t k) {
  float* p = arena().params + ranges()[k].begin;
  const auto b = range_bounds(k);
  return collective("the all-gather of a layer's weights", [&] { dc_.all_gather(p, b); });
}

Result<std::unique_ptr<PendingCollective>> DeviceParamShards::start_gather_range(size_t k) {
  TROUPE_TRY(gather_range(k));
  return std::unique_ptr<PendingCollective>(std::make_unique<Finished>());
}

Status DeviceParamShards::reduce_range(size_t k) {
  float* g = arena().grads + ranges()[k].begin;
  const auto b = range_bounds(k);
  return collective("the reduce-scatter of a layer's gradient", [&] { dc_.reduce_scatter_sum(g, b); });
}

Result<std::unique_ptr<PendingCollective>> DeviceParamShards::start_reduce_range(size_t k) {
  TROUPE_TRY(reduce_range(k));
  return std::unique_ptr<PendingCollective>(std::make_unique<Finished>());
}

Status DeviceParamShards::gather_whole() {
  for (size_t k = 0; k < ranges().size(); ++k) TROUPE_TRY(map(false, k, true));
  float* p = arena().params;
  return collective("the all-gather of the whole weights", [&] { dc_.all_gather(p, bounds()); });
}

// The device collective has no gather to one rank: every rank gathers the whole, and the others
// drop it again at once (ParamShards::gather_to).
Status DeviceParamShards::gather_whole_to(int root) {
  (void)root;
  return gather_whole();
}

}  // namespace troupe::learner
