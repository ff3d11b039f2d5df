// The in-process collective (troupe/kernels/local_collective.h).
#include "troupe/kernels/local_collective.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace troupe::kernels {
namespace {

constexpr char kTag[] = "troupe-local:";

// One operation of the group, by its sequence number: what the ranks handed in so far.
struct Slot {
  std::vector<std::vector<float>> by_rank;  // broadcast: [root] only; the others: every rank's
  int arrived = 0, left = 0;                // ranks that handed in / that have not taken the result
  size_t n = 0;
};

struct Group {
  int nranks = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Slot> broadcasts, reductions;
  std::vector<bool> joined;
};

std::mutex registry_mu;
std::map<std::string, std::shared_ptr<Group>>& registry() {
  static auto* r = new std::map<std::string, std::shared_ptr<Group>>();
  return *r;
}

std::string size_error(const char* op, uint64_t seq, size_t want, size_t got) {
  return std::string("local collective: ") + op + " #" + std::to_string(seq) + ": " + std::to_string(got) +
         " values here, " + std::to_string(want) + " at another rank";
}

class LocalCollective final : public DeviceCollective {
 public:
  LocalCollective(const Backend& b, std::shared_ptr<Group> g, int rank) : b_(b), g_(std::move(g)), rank_(rank) {}

  void broadcast(float* buf, size_t n, int root) override {
    const uint64_t seq = next_broadcast_++;
    if (rank_ == root) {
      std::vector<float> out(n);
      b_.copy_device_to_host(out.data(), buf, n * sizeof(float));
      std::lock_guard<std::mutex> lock(g_->mu);
      Slot& s = g_->broadcasts[seq];
      if (s.arrived > 0 && s.n != n) throw std::runtime_error(size_error("broadcast", seq, s.n, n));
      s.by_rank.assign(1, std::move(out));
      s.n = n;
      s.left += g_->nranks - 1;
      if (s.left == 0) g_->broadcasts.erase(seq);
      g_->cv.notify_all();
      return;
    }
    std::unique_lock<std::mutex> lock(g_->mu);
    Slot& s = g_->broadcasts[seq];
    if (s.arrived == 0 && s.by_rank.empty()) s.n = n;
    ++s.arrived;
    g_->cv.wait(lock, [&] { return !s.by_rank.empty(); });
    if (s.n != n) throw std::runtime_error(size_error("broadcast", seq, s.n, n));
    b_.copy_host_to_device(buf, s.by_rank[0].data(), n * sizeof(float));
    if (--s.left == 0) g_->broadcasts.erase(seq);
  }

  void all_reduce_sum(float* buf, size_t n) override {
    std::vector<float> sum = from_every_rank(buf, n, "all_reduce_sum", [n](const Ranks& all) {
      std::vector<float> s(all[0]);
      for (size_t r = 1; r < all.size(); ++r)
        for (size_t i = 0; i < n; ++i) s[i] += all[r][i];
      return s;
    });
    b_.copy_host_to_device(buf, sum.data(), n * sizeof(float));
  }

  void reduce_scatter_sum(float* buf, std::span<const size_t> bounds) override {
    const auto [lo, hi] = my_shard(bounds, "reduce_scatter_sum");
    std::vector<float> sum = from_every_rank(buf, bounds.back(), "reduce_scatter_sum", [lo, hi](const Ranks& all) {
      std::vector<float> s(all[0].begin() + static_cast<std::ptrdiff_t>(lo), all[0].begin() + static_cast<std::ptrdiff_t>(hi));
      for (size_t r = 1; r < all.size(); ++r)
        for (size_t i = lo; i < hi; ++i) s[i - lo] += all[r][i];
      return s;
    });
    b_.copy_host_to_device(buf + lo, sum.data(), (hi - lo) * sizeof(float));
  }

  void all_gather(float* buf, std::span<const size_t> bounds) override {
    (void)my_shard(bounds, "all_gather");
    std::vector<float> whole = from_every_rank(buf, bounds.back(), "all_gather", [bounds](const Ranks& all) {
      std::vector<float> w(bounds.back());
      for (size_t r = 0; r < all.size(); ++r)
        std::copy(all[r].begin() + static_cast<std::ptrdiff_t>(bounds[r]),
                  all[r].begin() + static_cast<std::ptrdiff_t>(bounds[r + 1]), w.begin() + static_cast<std::ptrdiff_t>(bounds[r]));
      return w;
    });
    b_.copy_host_to_device(buf, whole.data(), whole.size() * sizeof(float));
  }

 private:
  using Ranks = std::vector<std::vector<float>>;
  // Operation #seq where every rank hands in its buffer's n values: once all have, `combine` makes
  // this rank's result from every rank's values (in rank order).
  template <class Combine>
  std::vector<float> from_every_rank(const float* buf, size_t n, const char* op, Combine combine) {
    const uint64_t seq = next_reduction_++;
    std::vector<float> mine(n);
    b_.copy_device_to_host(mine.data(), buf, n * sizeof(float));
    std::unique_lock<std::mutex> lock(g_->mu);
    Slot& s = g_->reductions[seq];
    if (s.by_rank.empty()) {
      s.by_rank.resize(static_cast<size_t>(g_->nranks));
      s.n = n;
      s.left = g_->nranks;
    }
    if (s.n != n) throw std::runtime_error(size_error(op, seq, s.n, n));
    s.by_rank[static_cast<size_t>(rank_)] = std::move(mine);
    if (++s.arrived == g_->nranks) g_->cv.notify_all();
    g_->cv.wait(lock, [&] { return s.arrived == g_->nranks; });
    std::vector<float> out = combine(s.by_rank);
    if (--s.left == 0) g_->reductions.erase(seq);
    return out;
  }
  std::pair<size_t, size_t> my_shard(std::span<const size_t> bounds, const char* op) const {
    if (bounds.size() != static_cast<size_t>(g_->nranks) + 1 || bounds.front() != 0 ||
        !std::is_sorted(bounds.begin(), bounds.end()))
      throw std::runtime_error(std::string("local collective: ") + op + ": " + std::to_string(bounds.size()) +
                               " shard bounds for " + std::to_string(g_->nranks) +
                               " ranks (want ranks + 1 ascending offsets from 0)");
    return {bounds[static_cast<size_t>(rank_)], bounds[static_cast<size_t>(rank_) + 1]};
  }

  const Backend& b_;
  std::shared_ptr<Group> g_;
  int rank_;
  uint64_t next_broadcast_ = 0, next_reduction_ = 0;
};

}  // namespace

std::vector<uint8_t> local_collective_id() {
  static std::atomic<uint64_t> next{0};
  const std::string s = kTag + std::to_string(next.fetch_add(1));
  return std::vector<uint8_t>(s.begin(), s.end());
}

Result<std::unique_ptr<DeviceCollective>> join_local_collective(const Backend& backend, const std::vector<uint8_t>& id,
                                                                int nranks, int rank) {
  const std::string key(id.begin(), id.end());
  if (key.rfind(kTag, 0) != 0)
    return make_error(ErrorCode::invalid_input, "local collective: the id is not one of this process's (" +
                                                    std::to_string(id.size()) + " bytes)");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return make_error(ErrorCode::invalid_input, "local collective: rank " + std::to_string(rank) + " of " +
                                                    std::to_string(nranks));
  std::shared_ptr<Group> g;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto& slot = registry()[key];
    if (!slot) {
      slot = std::make_shared<Group>();
      slot->nranks = nranks;
      slot->joined.assign(static_cast<size_t>(nranks), false);
    }
    g = slot;
  }
  std::lock_guard<std::mutex> lock(g->mu);
  if (g->nranks != nranks)
    return make_error(ErrorCode::invalid_input, "local collective " + key + ": joined with " + std::to_string(nranks) +
                                                    " ranks, but it has " + std::to_string(g->nranks));
  if (g->joined[static_cast<size_t>(rank)])
    return make_error(ErrorCode::invalid_input, "local collective " + key + ": rank " + std::to_string(rank) +
                                                    " joined twice");
  g->joined[static_cast<size_t>(rank)] = true;
  return std::unique_ptr<DeviceCollective>(new LocalCollective(backend, std::move(g), rank));
}

}  // namespace troupe::kernels
