// Private to the `dataset` env: the order rows are drawn in with `shuffle: true`. Draw n of an env
// takes row perm_e[n mod N] where e = n / N is the epoch and perm_e a permutation of the N rows
// from (seed, e): every row once per epoch, the same order for the same seed. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <numeric>
#include <vector>

#include "src/config_util.h"

namespace troupe::envs::detail {

class RowOrder {
 public:
  explicit RowOrder(uint64_t seed) : seed_(seed) {}

  static uint64_t epoch_of(uint64_t draw, size_t rows) { return draw / rows; }

  // The row of draw `draw` among `rows` rows.
  size_t row_of(uint64_t draw, size_t rows) {
    const uint64_t epoch = epoch_of(draw, rows);
    std::lock_guard lock(mu_);
    if (!cached_ || epoch_ != epoch || perm_.size() != rows) {
      perm_.resize(rows);
      std::iota(perm_.begin(), perm_.end(), size_t{0});
      SplitMix rng(seed_ ^ (0x5851f42d4c957f2dull * (epoch + 1)));
      for (size_t i = rows; i > 1; --i) {  // Fisher-Yates
        const auto j = static_cast<size_t>(rng.next() % i);
        std::swap(perm_[i - 1], perm_[j]);
      }
      epoch_ = epoch;
      cached_ = true;
    }
    return perm_[draw % rows];
  }

 private:
  uint64_t seed_;
  std::mutex mu_;
  bool cached_ = false;
  uint64_t epoch_ = 0;
  std::vector<size_t> perm_;
};

}  // namespace troupe::envs::detail
