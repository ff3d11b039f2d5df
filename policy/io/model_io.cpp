// Model <-> model directory. The Model's table uses per-expert Hugging Face names (Mixtral under
// block_sparse_moe), so its tensors are exactly the per-expert on-disk names of the family; the
// canonical map is converted to that layout and copied entry by entry, each shape checked.
#include "troupe/policy/io/model_io.h"

#include <algorithm>
#include <cstring>

#include "troupe/policy/io/gguf_import.h"
#include "troupe/policy/io/gguf_model.h"

namespace troupe::policy::io {

namespace {

// Every tensor of the model's table from `named` (on-disk names, per expert), shapes checked.
Status fill_model(Model& model, TensorMap& named, const std::string& dir_path, const ExecutionOptions& exec) {
  std::vector<float> flat(model.params().begin(), model.params().end());
  for (const TensorSpec& spec : model.tensors()) {
    if (spec.quantized && exec.base_dtype == BaseDtype::gguf)
      return invalid_input("policy.base_dtype: gguf keeps the blocks of a .gguf policy.path; " + dir_path +
                           " is a model directory (use bf16, q8_0 or q4_k to quantize it)");
    auto it = named.find(spec.name);
    if (it == named.end())
      return make_error(ErrorCode::internal, dir_path + ": the model's tensor '" + spec.name +
                                                 "' has no counterpart in the directory's tensors (io/model mapping out of date)");
    if (it->second.shape != spec.shape)
      return invalid_input(dir_path + ": tensor '" + spec.name + "' has shape " + shape_string(it->second.shape) +
                           ", the model expects " + shape_string(spec.shape));
    if (spec.quantized) {  // QLoRA: quantized into policy.base_dtype, never kept as fp32
      TROUPE_TRY(model.set_base_quant_values(spec.name, it->second.data));
      it->second.data = std::vector<float>();
      continue;
    }
    std::copy(it->second.data.begin(), it->second.data.end(), flat.begin() + static_cast<std::ptrdiff_t>(spec.offset));
    it->second.data = std::vector<float>();  // (each value held twice for one tensor at most)
  }
  return model.set_params(flat);
}

}  // namespace

Result<Model> model_from_dir(const ModelDir& dir, const ExecutionOptions& exec) {
  ModelConfig config = dir.config;
  static_cast<ExecutionOptions&>(config) = exec;
  auto created = Model::create(config, 0);
  if (!created.ok()) return invalid_input(dir.path + "/config.json: " + created.error().message);
  Model model = std::move(created).value();
  TROUPE_ASSIGN_OR_RETURN(auto named, hf_tensors_from_canonical(dir.config, dir.tensors, ExpertLayout::per_expert));
  TROUPE_TRY(fill_model(model, named, dir.path, exec));
  return model;
}

Result<LoadedModel> load_model(const std::string& path, const ExecutionOptions& exec) {
  const bool gguf_base = exec.base_dtype == BaseDtype::gguf;
  if (gguf_base && !path.ends_with(".gguf"))
    return invalid_input("policy.base_dtype: gguf keeps the blocks of a .gguf policy.path; " + path +
                         " is not a .gguf file (use bf16, q8_0 or q4_k to quantize a model directory)");
  TROUPE_ASSIGN_OR_RETURN(std::string dir_path, model_dir_for(path));  // a .gguf: its $TROUPE_CACHE/gguf/ import
  // base_dtype gguf: config and tokenizer from the import, every weight from the .gguf itself.
  TROUPE_ASSIGN_OR_RETURN(auto dir, load_model_dir(dir_path, !gguf_base));
  Result<Model> loaded = gguf_base ? model_from_gguf(path, dir, exec) : model_from_dir(dir, exec);
  TROUPE_ASSIGN_OR_RETURN(auto model, std::move(loaded));
  LoadedModel out{std::move(model), std::move(dir.tokenizer), dir.bos_token_id, dir.eos_token_id, dir.pad_token_id};
  return out;
}

Result<LoadedModel> load_expert_block(const std::string& path, int shard, int shards, const ExecutionOptions& exec) {
  if (exec.base_dtype != BaseDtype::fp32)
    return invalid_input("policy.moe.expert_parallel: not with a quantized base (policy.base_dtype)");
  TROUPE_ASSIGN_OR_RETURN(std::string dir_path, model_dir_for(path));  // a .gguf: its $TROUPE_CACHE/gguf/ import
  TROUPE_ASSIGN_OR_RETURN(auto dir, load_model_dir(dir_path, false));  // config.json and the tokenizer
  ModelConfig config = dir.config;
  static_cast<ExecutionOptions&>(config) = exec;
  auto created = Model::create_expert_block(config, 0, shard, shards);
  if (!created.ok()) return invalid_input(dir.path + "/config.json: " + created.error().message);
  Model model = std::move(created).value();
  const int per = dir.config.num_experts / shards;
  const ExpertRange experts{shard * per, per};
  TROUPE_ASSIGN_OR_RETURN(auto canonical, read_model_weights(dir_path, dir.config, experts));
  TROUPE_ASSIGN_OR_RETURN(auto named, hf_tensors_from_canonical(dir.config, canonical, ExpertLayout::per_expert, experts));
  canonical.clear();
  TROUPE_TRY(fill_model(model, named, dir.path, exec));
  LoadedModel out{std::move(model), std::move(dir.tokenizer), dir.bos_token_id, dir.eos_token_id, dir.pad_token_id};
  return out;
}

Result<TensorMap> model_tensors(const Model& model) {
  TensorMap named;
  // With LoRA the base's own weights (adapters unmerged); a quantized base's blocks dequantized.
  for (const TensorSpec& spec : model.base_tensors()) {
    if (spec.name == "lm_head.weight" && model.config().tie_word_embeddings) continue;
    TROUPE_ASSIGN_OR_RETURN(auto values, model.base_tensor_values(spec));
    named[spec.name] = Tensor{spec.shape, std::move(values)};
  }
  return canonicalize_tensors(model.config(), named, "model");
}

Status save_model(const std::string& path, const Model& model, const Tokenizer* tokenizer, ExpertLayout layout,
                  int32_t bos, int32_t eos, int32_t pad) {
  TROUPE_ASSIGN_OR_RETURN(auto tensors, model_tensors(model));
  return save_model_dir(path, model.config(), tensors, tokenizer, layout, bos, eos, pad);
}

Result<std::vector<float>> score_tokens(Model& model, const std::vector<int32_t>& tokens) {
  if (tokens.size() < 2) return invalid_input("score needs at least 2 tokens (got " + std::to_string(tokens.size()) + ")");
  const int V = model.config().vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      return invalid_input("token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                           " is outside the vocabulary (0.." + std::to_string(V - 1) + ")");
  PackedBatch b;
  b.tokens = tokens;
  b.cu_seqlens = {0, static_cast<int32_t>(tokens.size())};
  b.targets.assign(tokens.begin() + 1, tokens.end());
  b.targets.push_back(-1);
  std::vector<float> logp(tokens.size()), entropy(tokens.size());
  TROUPE_TRY(model.forward_train(b, 1.0f, logp.data(), entropy.data()));
  logp.pop_back();
  return logp;
}

}  // namespace troupe::policy::io
