// A LoRA run's checkpointed model files: the adapters in PEFT's layout (adapter_config.json +
// adapter_model.safetensors, what peft.PeftModel.from_pretrained loads) and base.json naming the base.
// Invariant: what write_lora_adapter_files writes, read_lora_adapter_files puts back bit for bit.
#pragma once

#include <string>

#include "troupe/base/result.h"
#include "troupe/policy/model.h"
#include "troupe/policy/model_config.h"

namespace troupe::learner {

// Writes DIR/adapter_config.json, DIR/adapter_model.safetensors (the model's adapters, fp32) and,
// when the base came from a file (base_path: policy.path, a Hugging Face directory or a .gguf),
// DIR/base.json {"path": base_path made absolute, "fingerprint": base_fingerprint of its config.json
// and the base's tensor table}. A fresh base (base_path empty) gets no base.json: `troupe export`
// then needs --base.
// with_weights false: all but adapter_model.safetensors (a sharded checkpoint's ranks write the
// adapters into its shards, sharded_checkpoint.h; read_peft_adapter reads them from there).
Status write_lora_adapter_files(const std::string& dir, const policy::Model& model, const std::string& base_path,
                                bool with_weights = true);

// Reads DIR's adapter (checked against the model's base tensors and its LoRA settings: r, lora_alpha,
// use_rslora, the adapted modules; a mismatch names the file and key) into the model's adapters.
Status read_lora_adapter_files(const std::string& dir, policy::Model& model);

}  // namespace troupe::learner
