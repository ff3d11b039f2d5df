// Sequence-classification scoring (transformers' *ForSequenceClassification, e.g. reward models): the
// decoder's final-norm hidden state at each sequence's scored token times the score head, forward only.
// Invariant: a sequence's scores depend on its own tokens alone (one packed batch, attention never
// crosses sequences), and the scored token is the one transformers pools (scored_position).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/policy/model.h"

namespace troupe::policy {

// transformers' `score` layer: nn.Linear(hidden_size, num_labels, bias=False).
struct ScoreHead {
  int num_labels = 1;
  int hidden_size = 0;
  std::vector<float> weight;  // (num_labels, hidden_size) row-major: score.weight
  int32_t pad_token_id = -1;  // config.json's pad_token_id; -1 = null (the last token is scored)
};

// The position in `tokens` whose hidden state is scored, as transformers pools it: the rightmost
// token that is not pad_token_id (position 0 when every token is), or the last token when
// pad_token_id is -1. tokens must not be empty.
int32_t scored_position(std::span<const int32_t> tokens, int32_t pad_token_id);

// Every label's score of each sequence, row-major (sequences x num_labels), in one forward pass
// over the sequences packed together; no gradients. An empty sequence, a token outside the
// vocabulary or a head whose width is not the model's hidden size is an error naming it.
Result<std::vector<float>> score_sequences_all(Model& model, const ScoreHead& head,
                                               const std::vector<std::vector<int32_t>>& sequences);

// One scalar per sequence: the score of label 0 (a reward model has num_labels 1; with more labels
// the first is taken, score_sequences_all gives them all).
Result<std::vector<float>> score_sequences(Model& model, const ScoreHead& head,
                                           const std::vector<std::vector<int32_t>>& sequences);

}  // namespace troupe::policy
