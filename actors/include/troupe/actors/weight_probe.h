// The weight-sync probe: log-probs of a fixed token sequence, which a generator computes with the
// weights it just applied and compares bit for bit with learner 0's (docs/weight_sync.md); equal
// checksums with different log-probs mean the weights are not what the learner has.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/policy/model.h"

namespace troupe::actors {

// The probe sequence for a model of `vocab_size` tokens: a fixed, spread-out sequence of ids.
std::vector<std::int32_t> probe_tokens(int vocab_size);
// log softmax (temperature 1) of each next token of `tokens` under `model` (tokens.size() - 1 values).
Result<std::vector<float>> probe_logprobs(policy::Model& model, const std::vector<std::int32_t>& tokens);
// The first index where a and b differ bit for bit (or where one ends), -1 when equal.
std::int64_t first_bit_difference(std::span<const float> a, std::span<const float> b);

}  // namespace troupe::actors
