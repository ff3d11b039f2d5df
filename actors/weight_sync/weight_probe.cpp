// The weight-sync probe (weight_probe.h): a fixed, spread-out token sequence per vocabulary size,
// its next-token log-probs under a model (one packed forward pass, temperature 1), and the first
// bit-level difference between two such lists. Deterministic: the same weights give the same bits.
#include "troupe/actors/weight_probe.h"

#include <algorithm>
#include <bit>

namespace troupe::actors {

std::vector<std::int32_t> probe_tokens(int vocab_size) {
  constexpr int kProbeLength = 32;
  std::vector<std::int32_t> t(kProbeLength);
  const auto V = static_cast<std::uint64_t>(std::max(1, vocab_size));
  for (int i = 0; i < kProbeLength; ++i)  // a prime stride: ids spread over the vocabulary, none repeated early
    t[static_cast<size_t>(i)] = static_cast<std::int32_t>((static_cast<std::uint64_t>(i) * 7919u + 13u) % V);
  return t;
}

Result<std::vector<float>> probe_logprobs(policy::Model& model, const std::vector<std::int32_t>& tokens) {
  if (tokens.size() < 2) return invalid_input("probe: the sequence needs two tokens at least");
  policy::PackedBatch b;
  b.tokens = tokens;
  b.cu_seqlens = {0, static_cast<std::int32_t>(tokens.size())};
  b.targets.assign(tokens.size(), -1);
  for (size_t t = 0; t + 1 < tokens.size(); ++t) b.targets[t] = tokens[t + 1];
  std::vector<float> logp(tokens.size()), entropy(tokens.size());
  TROUPE_TRY(model.forward_train(b, 1.0f, logp.data(), entropy.data()));
  logp.resize(tokens.size() - 1);
  return logp;
}

std::int64_t first_bit_difference(std::span<const float> a, std::span<const float> b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return static_cast<std::int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<std::int64_t>(n);
}

}  // namespace troupe::actors
