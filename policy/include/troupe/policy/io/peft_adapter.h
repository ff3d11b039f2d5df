// LoRA adapters in the PEFT layout (adapter_config.json + adapter_model.safetensors, what
// `peft.PeftModel.from_pretrained` loads), their merge into base weights, and the base's identity.
// Invariant: an adapter troupe accepts computes exactly W + s·B·A on each adapted module, s = alpha/r
// (alpha/√r with use_rslora); any file setting that would change that math is refused by name.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/base/result.h"
#include "troupe/policy/io/safetensors.h"
#include "troupe/policy/model.h"
#include "troupe/policy/model_config.h"

namespace troupe::policy::io {

inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";
inline constexpr const char* kAdapterBaseFile = "base.json";  // troupe's {"path", "fingerprint"} beside them

// The adapter_config.json fields troupe reads and writes (PEFT's LoraConfig names). Every other
// field PEFT writes is written with its neutral default.
struct PeftAdapterConfig {
  int64_t r = 8;
  double lora_alpha = 8;
  double lora_dropout = 0;
  // PEFT matches a module whose path equals an entry or ends with "." + entry: leaf names (q_proj, ...,
  // mixtral w1 w2 w3; peft_target_modules) or, as PEFT itself writes them, the full module paths.
  std::vector<std::string> target_modules;  // sorted
  std::string target_modules_regex;         // set instead when the file has a regex string (PEFT's re.fullmatch)
  bool use_rslora = false;
  std::string base_model_name_or_path;
  nlohmann::json init_lora_weights = true;  // true, false or "gaussian" (the others alter the base: refused)
  std::string task_type = "CAUSAL_LM";
  std::string peft_type = "LORA";
  std::string bias = "none";

  double scaling() const;  // lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
};

// A LoRA pair as PEFT names it: `base_model.model.<module>.lora_A.weight` (r, in) and
// `base_model.model.<module>.lora_B.weight` (out, r).
std::string lora_a_name(std::string_view module);
std::string lora_b_name(std::string_view module);
// The module of an adapter tensor name and which half it is ('A' or 'B'); error when the name is not
// `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`.
Result<std::pair<std::string, char>> parse_lora_tensor_name(std::string_view name);

struct PeftAdapter {
  std::string dir;             // where it was read from ("" when built in memory)
  PeftAdapterConfig config;
  nlohmann::json raw_config;   // adapter_config.json as read
  TensorMap tensors;           // PEFT names -> fp32
  std::vector<std::string> modules() const;  // the adapted modules, sorted
};

// Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (fp32; names sorted; metadata
// format=pt) from `tensors` (PEFT names, shapes and float offsets into `values`). The tensor names
// must be LoRA pairs (parse_lora_tensor_name), each A (r, in) and B (out, r) with r = config.r.
// An empty config.target_modules is filled with the adapted modules' full paths (what PEFT writes; exact,
// where leaf names would also match modules left unadapted, e.g. qwen MoE experts' gate_proj).
Status write_peft_adapter(const std::string& dir, const PeftAdapterConfig& config,
                          std::span<const TensorSpec> tensors, std::span<const float> values);
// adapter_config.json alone, target_modules from the tensors' names when config has none (a sharded
// LoRA checkpoint's: its weights are in the shards, sharded_weights.h).
Status write_peft_adapter_config(const std::string& dir, const PeftAdapterConfig& config,
                                 std::span<const TensorSpec> tensors);

// Reads and checks an adapter directory: every adapter_config.json key that would change the math
// (use_dora, lora_bias, fan_in_fan_out, bias != none, modules_to_save, layer_replication, non-empty
// rank_pattern / alpha_pattern, target_parameters, trainable_token_indices, an init that alters the
// base, another peft_type, an unknown key with a non-null value ...) is an error naming the file and key;
// tensors must be LoRA pairs of rank r. With `base` (a model's tensor table: HF names and shapes), every
// module must be a 2-D projection `<module>.weight` of it other than the embedding or the head, with
// A (r, in) and B (out, r) matching its shape. Errors name the file and the tensor. A directory
// without adapter_model.safetensors but with shards.json (a sharded LoRA checkpoint) is read from its shards.
Result<PeftAdapter> read_peft_adapter(const std::string& dir, std::span<const TensorSpec> base = {});
// The checks `read_peft_adapter` does against a base, for an adapter already in memory.
Status check_adapter_base(const PeftAdapter& adapter, std::span<const TensorSpec> base);

// W <- W + s·(B·A) for every adapted module (fp32 result; each B·A entry summed over r in double,
// rounded once, then scaled, as PEFT's get_delta_weight does; the same on every machine).
// `base`: HF names -> tensors, or a flat buffer with its tensor table. The adapter is checked
// against the base first (check_adapter_base); nothing is changed on error.
Status merge_lora(TensorMap& base, const PeftAdapter& adapter);
Status merge_lora(std::span<float> params, std::span<const TensorSpec> specs, const PeftAdapter& adapter);

// The base's identity: "xxh3:<16 hex>" of config.json (parsed; key order and whitespace do not
// matter) and the sorted names and shapes of `tensors` (a Model's tensor table; LoRA tensors, whose
// names hold ".lora_A." / ".lora_B.", are left out). Identifies the architecture and its config,
// not the weight values.
std::string base_fingerprint(const nlohmann::json& hf_config, std::span<const TensorSpec> tensors);

// troupe's base reference beside an adapter: base.json {"path": ..., "fingerprint": ...} and, for an
// adapter trained over a quantized base (QLoRA), "base_dtype": the policy.base_dtype it ran with.
struct AdapterBaseRef {
  std::string path;         // HF model directory or .gguf file, as given at training time
  std::string fingerprint;  // base_fingerprint of it ("" = not recorded: not checked)
  std::optional<BaseDtype> base_dtype;  // not recorded: an fp32 base
};
Result<AdapterBaseRef> read_adapter_base_ref(const std::string& file);
// A policy.base_dtype name (fp32 bf16 q8_0 q4_k gguf); else an error "WHAT is NAME, expected one of ...".
Result<BaseDtype> base_dtype_named(std::string_view name, const std::string& what);
Status write_adapter_base_ref(const std::string& file, const AdapterBaseRef& ref);

// YAML `policy.lora.targets` kinds (q k v o gate up down experts all_linear) <-> PEFT module names,
// per family: q_proj k_proj v_proj o_proj; dense gate_proj up_proj down_proj; experts: qwen MoE
// gate_proj up_proj down_proj (the experts' own modules), mixtral w1 w2 w3. Errors name the kind.
Result<std::vector<std::string>> peft_target_modules(ModelFamily family, const std::vector<std::string>& kinds);
// The YAML kind a module path is (e.g. "model.layers.3.mlp.experts.5.gate_proj" -> "experts"), or ""
// when no kind covers it (router, shared expert, embedding, head).
std::string lora_kind_of_module(ModelFamily family, std::string_view module);

}  // namespace troupe::policy::io
