// LoRA models shared by the policy's LoRA tests: a random base with adapters whose B is drawn too
// (a fresh B is zero, so the low-rank path would contribute nothing), and a gradient snapshot.
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "test_models.h"

namespace troupe::policy::test {

// Every module kind but the routed experts.
inline const std::vector<LoraTarget> kLoraNoExperts = {LoraTarget::q,    LoraTarget::k,  LoraTarget::v,
                                                       LoraTarget::o,    LoraTarget::gate, LoraTarget::up,
                                                       LoraTarget::down};

// make(c, seed) with l's adapters enabled and every lora_B drawn from N(0, 0.2).
inline Model lora_model(ModelConfig c, const LoraConfig& l, uint64_t seed = 7) {
  Model m = make(c, seed);
  EXPECT_TRUE(m.enable_lora(l, seed).ok());
  std::mt19937 g(static_cast<unsigned>(seed + 1));
  std::normal_distribution<float> d(0.0f, 0.2f);
  auto p = m.params();
  for (const auto& t : m.tensors())
    if (t.name.ends_with("lora_B.weight"))
      for (size_t i = 0; i < t.numel(); ++i) p[t.offset + i] = d(g);
  return m;
}

// The trainable gradient of weighted_loss at temperature 0.9 (grads zeroed first).
inline std::vector<float> grads_of(Model& m, const PackedBatch& b, double* loss = nullptr) {
  m.zero_grads();
  const double L = weighted_loss(m, b, 0.9f, true);
  if (loss) *loss = L;
  return {m.grads().begin(), m.grads().end()};
}

// Central differences (h = 1e-3) of weighted_loss at two random entries (mt19937 seeded 13) of every
// adapter tensor against `g`, each within abs_tol + rel_tol |numeric|; returns the entries checked.
inline int check_adapter_gradients(Model& m, const PackedBatch& b, const std::vector<float>& g, double abs_tol,
                                   double rel_tol, const std::string& what) {
  std::mt19937 r(13);
  int checked = 0;
  for (const auto& t : m.tensors())
    for (int rep = 0; rep < 2; ++rep) {
      const size_t i = t.offset + r() % t.numel();
      float& p = m.params()[i];
      const float orig = p, h = 1e-3f;
      p = orig + h;
      const double lp = weighted_loss(m, b, 0.9f, false);
      p = orig - h;
      const double lm = weighted_loss(m, b, 0.9f, false);
      p = orig;
      const double num = (lp - lm) / (2 * h);
      EXPECT_NEAR(g[i], num, abs_tol + rel_tol * std::fabs(num)) << what << " " << t.name;
      ++checked;
    }
  return checked;
}

}  // namespace troupe::policy::test
