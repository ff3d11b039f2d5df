// Private helper: typed, range-checked reading of one env's JSON config. Every error names the
// env and the key; finish() rejects keys nobody read (typos must not pass silently).
#pragma once

#include <set>
#include <string>

#include "troupe/envs/env.h"

namespace troupe::envs::detail {

class ConfigReader {
 public:
  ConfigReader(const json& config, std::string where) : cfg_(config), where_(std::move(where)) {}

  Status check_object() const {
    if (cfg_.is_null() || cfg_.is_object()) return {};
    return invalid_input(where_ + ": config must be a mapping, got " + std::string(cfg_.type_name()));
  }
  Result<int64_t> integer(const std::string& key, int64_t def, int64_t lo, int64_t hi) {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_number_integer()) return bad(key, "an integer");
    auto x = v->get<int64_t>();
    if (x < lo || x > hi) return bad(key, "between " + std::to_string(lo) + " and " + std::to_string(hi) + " (got " + std::to_string(x) + ")");
    return x;
  }
  Result<double> number(const std::string& key, double def, double lo, double hi) {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_number()) return bad(key, "a number");
    auto x = v->get<double>();
    if (x < lo || x > hi) return bad(key, "between " + std::to_string(lo) + " and " + std::to_string(hi));
    return x;
  }
  Result<bool> boolean(const std::string& key, bool def) {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) return bad(key, "true or false");
    return v->get<bool>();
  }
  Result<std::string> string(const std::string& key, const std::string& def) {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_string()) return bad(key, "a string");
    return v->get<std::string>();
  }
  // `eval_fraction` (default 0.2), as the per-mille in_eval_bucket takes.
  Result<int> eval_permille() {
    TROUPE_ASSIGN_OR_RETURN(double fraction, number("eval_fraction", 0.2, 0.0, 1.0));
    return static_cast<int>(fraction * 1000 + 0.5);
  }
  const json* raw(const std::string& key) { return find(key); }
  Status finish() const {
    if (!cfg_.is_object()) return {};
    for (auto it = cfg_.begin(); it != cfg_.end(); ++it) {
      if (!used_.count(it.key())) return invalid_input(where_ + ": unknown config key '" + it.key() + "'");
    }
    return {};
  }
  const std::string& where() const { return where_; }

 private:
  const json* find(const std::string& key) {
    used_.insert(key);
    if (!cfg_.is_object()) return nullptr;
    auto it = cfg_.find(key);
    if (it == cfg_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  Error bad(const std::string& key, const std::string& want) const {
    return invalid_input(where_ + ": '" + key + "' must be " + want);
  }
  const json& cfg_;
  std::string where_;
  std::set<std::string> used_;
};

// splitmix64: the deterministic generator every built-in draws instances from.
struct SplitMix {
  uint64_t s;
  explicit SplitMix(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t uniform(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
};

// Draws instances for `split` from seed: candidate k is drawn from SplitMix(seed*K + k) until one
// falls in the split's bucket. `draw(rng)` returns the instance's canonical text.
template <class Draw>
Status draw_in_split(uint64_t seed, Split split, int eval_permille, const std::string& env, Draw&& draw) {
  if (split == Split::eval && eval_permille <= 0)
    return invalid_input("env " + env + ": eval split requested but eval_fraction is 0");
  if (split == Split::train && eval_permille >= 1000)
    return invalid_input("env " + env + ": train split requested but eval_fraction is 1");
  for (uint64_t k = 0; k < 100000; ++k) {
    SplitMix rng(seed * 0x100000001b3ull + k * 0x9e3779b97f4a7c15ull + 12345);
    std::string canonical = draw(rng);
    if (in_eval_bucket(canonical, eval_permille) == (split == Split::eval)) return {};
  }
  return invalid_input("env " + env + ": could not draw a " + split_name(split) +
                       " instance (the instance space is too small for eval_fraction)");
}

}  // namespace troupe::envs::detail
