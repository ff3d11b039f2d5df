// Sequence-classification scoring over a packed batch (reward_model.h): pooled position per sequence,
// one forward_hidden call, then the score head's dot products on the host in double precision.
// Invariant: the scores are transformers' pooled logits of the same tokens (policy.reward_model_golden).
#include "troupe/policy/reward_model.h"

#include <string>

namespace troupe::policy {

int32_t scored_position(std::span<const int32_t> tokens, int32_t pad_token_id) {
  const auto n = static_cast<int32_t>(tokens.size());
  if (pad_token_id < 0) return n - 1;
  for (int32_t i = n - 1; i >= 0; --i)
    if (tokens[static_cast<size_t>(i)] != pad_token_id) return i;
  return 0;  // all pad: transformers' argmax over an all-zero mask
}

namespace {

Status check_inputs(const Model& model, const ScoreHead& head, const std::vector<std::vector<int32_t>>& sequences) {
  const ModelConfig& cfg = model.config();
  if (head.num_labels < 1 || head.hidden_size != cfg.hidden_size ||
      head.weight.size() != static_cast<size_t>(head.num_labels) * static_cast<size_t>(head.hidden_size))
    return invalid_input("score head: weight of " + std::to_string(head.weight.size()) + " values for " +
                         std::to_string(head.num_labels) + " labels x hidden size " + std::to_string(head.hidden_size) +
                         " (the model's hidden size is " + std::to_string(cfg.hidden_size) + ")");
  for (size_t s = 0; s < sequences.size(); ++s) {
    if (sequences[s].empty()) return invalid_input("score: sequence " + std::to_string(s) + " is empty");
    for (size_t i = 0; i < sequences[s].size(); ++i) {
      const int32_t t = sequences[s][i];
      if (t < 0 || t >= cfg.vocab_size)
        return invalid_input("score: sequence " + std::to_string(s) + " token " + std::to_string(i) + " is " +
                             std::to_string(t) + ", outside the vocabulary (0.." + std::to_string(cfg.vocab_size - 1) +
                             ")");
    }
  }
  return {};
}

}  // namespace

Result<std::vector<float>> score_sequences_all(Model& model, const ScoreHead& head,
                                               const std::vector<std::vector<int32_t>>& sequences) {
  TROUPE_TRY(check_inputs(model, head, sequences));
  if (sequences.empty()) return std::vector<float>{};
  PackedBatch batch;
  batch.cu_seqlens.push_back(0);
  std::vector<int32_t> rows;
  rows.reserve(sequences.size());
  for (const auto& seq : sequences) {
    rows.push_back(static_cast<int32_t>(batch.tokens.size()) + scored_position(seq, head.pad_token_id));
    batch.tokens.insert(batch.tokens.end(), seq.begin(), seq.end());
    batch.cu_seqlens.push_back(static_cast<int32_t>(batch.tokens.size()));
  }
  const auto C = static_cast<size_t>(head.hidden_size);
  std::vector<float> hidden(rows.size() * C);
  TROUPE_TRY(model.forward_hidden(batch, rows, hidden.data()));
  const auto K = static_cast<size_t>(head.num_labels);
  std::vector<float> out(rows.size() * K);
  for (size_t s = 0; s < rows.size(); ++s)
    for (size_t k = 0; k < K; ++k) {
      double acc = 0;
      for (size_t c = 0; c < C; ++c) acc += static_cast<double>(head.weight[k * C + c]) * hidden[s * C + c];
      out[s * K + k] = static_cast<float>(acc);
    }
  return out;
}

Result<std::vector<float>> score_sequences(Model& model, const ScoreHead& head,
                                           const std::vector<std::vector<int32_t>>& sequences) {
  TROUPE_ASSIGN_OR_RETURN(auto all, score_sequences_all(model, head, sequences));
  const auto K = static_cast<size_t>(head.num_labels);
  std::vector<float> out(sequences.size());
  for (size_t s = 0; s < out.size(); ++s) out[s] = all[s * K];
  return out;
}

}  // namespace troupe::policy
