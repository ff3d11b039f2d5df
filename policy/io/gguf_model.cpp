// A .gguf file loaded straight into a quantized base (policy.base_dtype: gguf, QLoRA): the linear
// projections keep the file's blocks (llama's q/k rows un-permuted block row by block row), the
// other tensors are read as fp32. Invariant: no projection ever exists as fp32 on the way; what
// the model computes equals the fp32 import with those blocks dequantized.
#include "troupe/policy/io/gguf_model.h"

#include <map>

#include "troupe/policy/io/gguf_import.h"
#include "troupe/policy/io/gguf_quant.h"

namespace troupe::policy::io {

namespace {

// Fills one quantized projection from the file's blocks (q/k of a llama GGUF un-permuted).
Status load_quantized(Model& model, const GgufFile& file, const TensorSpec& spec, const std::string& gname,
                      bool permuted_qk) {
  const ModelConfig& c = model.config();
  TROUPE_ASSIGN_OR_RETURN(auto q, read_quant_matrix(file, gname));
  const std::string what = file.path() + ": tensor '" + gname + "'";
  if (permuted_qk && spec.name.ends_with("self_attn.q_proj.weight")) {
    TROUPE_ASSIGN_OR_RETURN(q, unpermute_qk_rows(q, c.num_attention_heads, what));
  } else if (permuted_qk && spec.name.ends_with("self_attn.k_proj.weight")) {
    TROUPE_ASSIGN_OR_RETURN(q, unpermute_qk_rows(q, c.num_key_value_heads, what));
  }
  if (q.rows != spec.shape[0] || q.cols != spec.shape[1])
    return invalid_input(what + " is a (" + std::to_string(q.rows) + ", " + std::to_string(q.cols) + ") matrix, the model expects " +
                         shape_string(spec.shape));
  return model.set_base_quant(spec.name, std::move(q));
}

}  // namespace

Result<Model> model_from_gguf(const std::string& gguf_path, const ModelDir& meta, const ExecutionOptions& exec) {
  TROUPE_ASSIGN_OR_RETURN(auto file, GgufFile::open(gguf_path));
  TROUPE_ASSIGN_OR_RETURN(std::string arch, file.get_string("general.architecture"));
  const bool permuted_qk = arch == "llama";  // convert_hf_to_gguf.py permutes llama's q/k rows only
  ModelConfig config = meta.config;
  static_cast<ExecutionOptions&>(config) = exec;
  auto created = Model::create(config, 0);
  if (!created.ok()) return invalid_input(gguf_path + ": " + created.error().message);
  Model model = std::move(created).value();
  std::map<std::string, std::string> gguf_name;  // HF name -> the file's
  for (const auto& t : file.tensors())
    if (std::string hf = hf_name_from_gguf(t.name); !hf.empty()) gguf_name[hf] = t.name;
  std::vector<float> flat(model.params().begin(), model.params().end());
  for (const TensorSpec& spec : model.tensors()) {
    auto g = gguf_name.find(spec.name);
    if (g == gguf_name.end()) return invalid_input(gguf_path + ": missing tensor for '" + spec.name + "'");
    if (spec.quantized) {
      TROUPE_TRY(load_quantized(model, file, spec, g->second, permuted_qk));
      continue;
    }
    TROUPE_ASSIGN_OR_RETURN(Tensor t, file.read(g->second));
    if (t.shape != spec.shape)
      return invalid_input(gguf_path + ": tensor '" + g->second + "' has shape " + shape_string(t.shape) +
                           ", the model expects " + shape_string(spec.shape));
    std::copy(t.data.begin(), t.data.end(), flat.begin() + static_cast<std::ptrdiff_t>(spec.offset));
  }
  TROUPE_TRY(model.set_params(flat));
  // The LM head's sampling blocks: the file's (the tied embedding's when there is no output.weight).
  const std::string head = config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  auto g = gguf_name.find(head);
  if (g == gguf_name.end()) return invalid_input(gguf_path + ": missing tensor for '" + head + "'");
  TROUPE_ASSIGN_OR_RETURN(auto head_blocks, read_quant_matrix(file, g->second));
  TROUPE_TRY(model.set_base_quant(head, std::move(head_blocks)));
  return model;
}

}  // namespace troupe::policy::io
