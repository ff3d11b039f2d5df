// GGUF -> Hugging Face model directory (`troupe import`, and a `.gguf` policy.path): config.json
// from the llama.* metadata, model.safetensors under HF names with llama.cpp's q/k row permutation
// undone, tokenizer.json rebuilt from tokenizer.ggml.*, tokenizer_config.json and
// generation_config.json (policy/io/README.md, "GGUF"). Errors name the file and the reason.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "troupe/base/result.h"
#include "troupe/policy/io/gguf.h"
#include "troupe/policy/io/safetensors.h"

namespace troupe::policy::io {

// The files of the directory, in memory.
struct ImportedGguf {
  nlohmann::json config;             // config.json
  TensorMap tensors;                 // HF names, fp32 (no lm_head.weight when tied)
  nlohmann::json tokenizer;          // tokenizer.json
  nlohmann::json tokenizer_config;   // tokenizer_config.json
  nlohmann::json generation_config;  // generation_config.json
};

// GGUF tensor name -> HF name ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight");
// "" for a name troupe does not map.
std::string hf_name_from_gguf(const std::string& gguf_name);

// Undoes convert_hf_to_gguf.py's permutation of q/k rows for `heads` heads (rows = heads x head_dim):
// GGUF row h*D + 2i + j holds HF row h*D + j*D/2 + i (rotary pairs interleaved -> halves).
Result<Tensor> unpermute_qk(const Tensor& t, int64_t heads, const std::string& what);

Result<ImportedGguf> import_gguf(const GgufFile& file);

// config.json alone (what import_gguf writes there, without the special token ids): the model's
// shape from the metadata, no tensor read (`troupe plan`).
Result<nlohmann::json> gguf_config_json(const GgufFile& file);

// Imports `gguf_path` into out_dir (created; files written to a temporary name, then renamed).
Status import_gguf_to_dir(const std::string& gguf_path, const std::string& out_dir, DType dtype = DType::f32);

// The directory a `.gguf` policy.path loads from: $TROUPE_CACHE (default ~/.cache/troupe)
// /gguf/<file stem>-<size>-<mtime>, imported on first use.
Result<std::string> cached_gguf_import(const std::string& gguf_path);

// The model directory `path` names: itself, or for a `.gguf` file its cached import.
Result<std::string> model_dir_for(const std::string& path);

}  // namespace troupe::policy::io
