// BigramModel (see policy_model.h): exact log-softmax/entropy forward and backward in double,
// so finite-difference and PyTorch checks of the learner do not depend on the real model.
#include <cmath>
#include <random>
#include <string>

#include "troupe/learner/policy_model.h"

namespace troupe::learner {

BigramModel::BigramModel(int V, uint64_t seed, float init_scale) : V_(V) {
  specs_.push_back({"model.embed_tokens.weight", {V, V}, 0});
  specs_.push_back({"lm_head.bias", {V}, static_cast<size_t>(V) * V});
  params_.resize(static_cast<size_t>(V) * V + V);
  grads_.assign(params_.size(), 0.0f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, init_scale);
  for (float& p : params_) p = nd(rng);
}

void BigramModel::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

Status BigramModel::forward_train(const policy::PackedBatch& b, float temperature, float* logp, float* entropy) {
  const size_t T = b.tokens.size();
  if (b.targets.size() != T) return invalid_input("bigram: targets and tokens differ in length");
  if (!(temperature > 0)) return invalid_input("bigram: temperature must be > 0");
  tokens_ = b.tokens;
  targets_ = b.targets;
  temperature_ = temperature;
  probs_.assign(T * V_, 0.0f);
  logp_all_.assign(T * V_, 0.0f);
  entropy_.assign(T, 0.0f);
  const float* W = params_.data();
  const float* bias = params_.data() + static_cast<size_t>(V_) * V_;
  std::vector<double> z(V_);
  for (size_t t = 0; t < T; ++t) {
    const int x = b.tokens[t];
    if (x < 0 || x >= V_) return invalid_input("bigram: token " + std::to_string(x) + " out of vocab at " + std::to_string(t));
    double mx = -1e300;
    for (int j = 0; j < V_; ++j) {
      z[j] = (static_cast<double>(W[static_cast<size_t>(x) * V_ + j]) + bias[j]) / temperature;
      mx = std::max(mx, z[j]);
    }
    double se = 0;
    for (int j = 0; j < V_; ++j) se += std::exp(z[j] - mx);
    const double lse = mx + std::log(se);
    double H = 0;
    for (int j = 0; j < V_; ++j) {
      const double lp = z[j] - lse, p = std::exp(lp);
      logp_all_[t * V_ + j] = static_cast<float>(lp);
      probs_[t * V_ + j] = static_cast<float>(p);
      H -= p * lp;
    }
    entropy_[t] = static_cast<float>(H);
    const int y = b.targets[t];
    if (y >= V_) return invalid_input("bigram: target " + std::to_string(y) + " out of vocab at " + std::to_string(t));
    if (logp) logp[t] = y >= 0 ? logp_all_[t * V_ + y] : 0.0f;
    if (entropy) entropy[t] = entropy_[t];
  }
  return {};
}

Status BigramModel::backward_train(const float* dlogp, const float* dentropy) {
  float* dW = grads_.data();
  float* db = grads_.data() + static_cast<size_t>(V_) * V_;
  const size_t T = tokens_.size();
  for (size_t t = 0; t < T; ++t) {
    const double gl = dlogp ? dlogp[t] : 0.0, ge = dentropy ? dentropy[t] : 0.0;
    if (gl == 0 && ge == 0) continue;
    const int x = tokens_[t], y = targets_[t];
    const double H = entropy_[t];
    for (int j = 0; j < V_; ++j) {
      const double p = probs_[t * V_ + j];
      // d logp_y / dz_j = [j==y] - p_j ;  d H / dz_j = -p_j (log p_j + H) ; z = logits / temperature
      double dz = 0;
      if (y >= 0) dz += gl * ((j == y ? 1.0 : 0.0) - p);
      dz += ge * (-p * (logp_all_[t * V_ + j] + H));
      const float g = static_cast<float>(dz / temperature_);
      dW[static_cast<size_t>(x) * V_ + j] += g;
      db[j] += g;
    }
  }
  return {};
}

}  // namespace troupe::learner
