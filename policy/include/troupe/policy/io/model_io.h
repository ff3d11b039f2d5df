// A Model from / to a model directory (docs/architecture.md, "Model directory"): config.json + model.safetensors
// in the Hugging Face layout of its family + tokenizer. Glue between model_dir.h and model.h; the
// Model's tensor table (per-expert HF names) is filled from the canonical tensors, shape-checked.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/model.h"

namespace troupe::policy::io {

struct LoadedModel {
  Model model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the directory has none
  int32_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;
};

// A Model with the directory's weights (every tensor of its table filled, shapes checked). The
// architecture is the directory's config.json; `exec` says how the model runs (backend, training
// optimizations), as the YAML's policy.* keys do for a fresh model.
Result<Model> model_from_dir(const ModelDir& dir, const ExecutionOptions& exec = {});
// A path ending in .gguf is imported first (gguf_import.h, cached_gguf_import); with
// exec.base_dtype gguf only its config and tokenizer are read from that import and the weights come
// straight from the .gguf (gguf_model.h). exec.base_dtype bf16/q8_0/q4_k quantizes the projections
// as they are read.
Result<LoadedModel> load_model(const std::string& path, const ExecutionOptions& exec = {});
// load_model(path, exec) then Model::slice_experts(shard, shards), bit for bit, without the whole
// model: Model::create_expert_block, filled from the shared tensors and this block's experts alone
// (read_model_weights: a safetensors directory's other experts are never read). A .gguf path loads
// from its cached import (imported whole once, as load_model does).
Result<LoadedModel> load_expert_block(const std::string& path, int shard, int shards, const ExecutionOptions& exec = {});

// The Model's base parameters under canonical names (for save_model_dir, comparisons); with LoRA
// the frozen base alone (its adapters are not merged in).
Result<TensorMap> model_tensors(const Model& model);

// Writes config.json + model.safetensors (transformers-loadable) [+ the tokenizer's file].
Status save_model(const std::string& path, const Model& model, const Tokenizer* tokenizer = nullptr,
                  ExpertLayout layout = ExpertLayout::per_expert, int32_t bos_token_id = -1,
                  int32_t eos_token_id = -1, int32_t pad_token_id = -1);

// log p(tokens[i+1] | tokens[0..i]) for i = 0..n-2 (n-1 values), one forward pass; what `troupe score` prints.
Result<std::vector<float>> score_tokens(Model& model, const std::vector<int32_t>& tokens);

}  // namespace troupe::policy::io
