// Reading a transformers sequence-classification directory (LlamaForSequenceClassification,
// Qwen2ForSequenceClassification, Qwen3ForSequenceClassification: a reward model) into a Model and
// its score head. Invariant: what loads scores as transformers does (policy.reward_model_golden);
// anything else is an error naming the file and the key or tensor.
#pragma once

#include <memory>
#include <string>

#include "troupe/base/result.h"
#include "troupe/policy/execution_options.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/policy/model.h"
#include "troupe/policy/reward_model.h"

namespace troupe::policy::io {

struct RewardModelDir {
  std::string path;
  std::string architecture;  // config.json's architectures[0], e.g. "LlamaForSequenceClassification"
  Model model;               // the decoder (no LM head: tie_word_embeddings is set, the head is never used)
  ScoreHead head;            // score.weight, num_labels, config.json's pad_token_id
  std::unique_ptr<Tokenizer> tokenizer;  // null when the directory has none
  std::string chat_template;             // Jinja text; empty when the directory has none
  int32_t bos_token_id = -1, eos_token_id = -1;  // config.json, else the tokenizer's
};

// The sequence-classification architectures troupe loads, comma-separated (for messages and docs).
const char* supported_reward_architectures();

// Loads DIR: config.json's `architectures` must name a supported *ForSequenceClassification whose
// family matches `model_type`; num_labels is len(id2label), else `num_labels`, else 2 (transformers'
// default); model.safetensors (or its index) must hold `score.weight` (num_labels, hidden_size) and
// the decoder's tensors under their causal-LM names (`model.*`), nothing else.
Result<RewardModelDir> load_reward_model(const std::string& path, const ExecutionOptions& exec = {});

// What load_reward_model checks before reading any weight: config.json (architecture, model_type,
// num_labels, pad_token_id) and the weight files' headers (score.weight present, its shape, no
// score.bias). Cheap; `troupe run` calls it before it starts any role, so a bad directory is exit 2.
Status check_reward_model_dir(const std::string& path);

}  // namespace troupe::policy::io
