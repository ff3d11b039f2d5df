// The versions and step notices of a generator with in-flight weight updates (in_flight_versions.h).
#include "in_flight_versions.h"

namespace troupe::actors {

void InFlightVersions::add(int64_t version, std::vector<float> params) {
  std::lock_guard lk(mu_);
  versions_[version] = std::move(params);
}

Status InFlightVersions::copy(int64_t version, std::vector<float>& out) const {
  std::lock_guard lk(mu_);
  auto it = versions_.find(version);
  if (it == versions_.end()) {
    std::string have;
    for (const auto& [v, p] : versions_) have += (have.empty() ? "" : ", ") + std::to_string(v);
    return make_error(ErrorCode::internal, "generator: asked to sample with policy version " + std::to_string(version) +
                                               " but it holds " + (have.empty() ? std::string("no other version")
                                                                                : "versions " + have));
  }
  out.assign(it->second.begin(), it->second.end());
  return {};
}

void InFlightVersions::drop_before(int64_t version) {
  std::lock_guard lk(mu_);
  versions_.erase(versions_.begin(), versions_.lower_bound(version));
}

int64_t InFlightVersions::newest(int64_t fallback) const {
  std::lock_guard lk(mu_);
  return versions_.empty() ? fallback : versions_.rbegin()->first;
}

void InFlightVersions::step_done(int64_t grpo_step, int64_t version) {
  {
    std::lock_guard lk(mu_);
    after_step_[grpo_step] = version;
  }
  cv_.notify_all();
}

void InFlightVersions::release() {
  {
    std::lock_guard lk(mu_);
    released_ = true;
  }
  cv_.notify_all();
}

std::optional<int64_t> InFlightVersions::wait_step(int64_t grpo_step) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return released_ || after_step_.count(grpo_step) > 0; });
  auto it = after_step_.find(grpo_step);
  if (it != after_step_.end()) return it->second;
  return std::nullopt;
}

}  // namespace troupe::actors
