// LoRA adapters on a loaded base for `troupe generate`, `eval --checkpoint`, `serve` and `export`
// (launch/serve/lora_adapters.cpp): where an adapter's base is, the checks that it fits that base
// (base.json's fingerprint, shapes, rank), and the adapter applied as the model's own LoRA or added
// as one of several served adapters. Invariant: nothing is applied to a model before every check
// passed; errors name the file, key and value at fault (both fingerprints on a mismatch).
#pragma once

#include <optional>
#include <string>

#include "troupe/base/result.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/peft_adapter.h"
#include "troupe/policy/model.h"

namespace troupe::serve {

// Whether `path` is a directory holding adapter_config.json (a LoRA checkpoint or PEFT adapter).
bool is_adapter_dir(const std::string& path);

// The base of the adapter in `dir`: `base_flag` when given (base.json's fingerprint, if there is one,
// is still checked), else DIR/base.json's path (a relative one tried as given, then from DIR).
// `flag_name` is how errors call base_flag (e.g. "--base").
Result<policy::io::AdapterBaseRef> adapter_base_ref(const std::string& dir, const std::string& base_flag,
                                                    const std::string& flag_name = "--base");
// The base as a model directory (a .gguf is imported once into $TROUPE_CACHE); errors say where the
// path came from.
Result<std::string> adapter_base_dir(const std::string& base_path, const std::string& dir, bool from_flag);

// base_fingerprint of the model loaded from `base_path` (its directory's config.json and the model's
// base tensor table).
Result<std::string> base_fingerprint_of(const std::string& base_path, const policy::Model& base);
// Refuses a base whose fingerprint differs from `ref`'s (none recorded: not checked), naming
// DIR/base.json, both fingerprints and the base's path.
Status check_base_fingerprint(const policy::io::AdapterBaseRef& ref, const std::string& actual, const std::string& dir);

// Reads DIR's adapter and checks it against `base` (loaded from ref.path): the fingerprint, every
// module one troupe applies LoRA to (attention q k v o, dense MLP gate up down), A and B shaped for
// the module, r at most min(in, out) of each.
Result<policy::io::PeftAdapter> read_adapter_for(const std::string& dir, const policy::io::AdapterBaseRef& ref,
                                                 const policy::Model& base);

// The adapter as the model's own LoRA (Model::enable_lora with its r, lora_alpha, use_rslora and
// module kinds; modules of those kinds it does not adapt get A = B = 0, which adds nothing).
Status apply_adapter(policy::Model& model, const policy::io::PeftAdapter& adapter);
// The adapter as one more served adapter of the model (Model::add_served_adapter); its id.
Result<int> add_served_adapter(policy::Model& model, const policy::io::PeftAdapter& adapter);

// --base-dtype NAME (fp32 bf16 q8_0 q4_k gguf, policy.base_dtype's names); an error naming the flag.
Result<policy::BaseDtype> parse_base_dtype(const std::string& name, const std::string& flag_name = "--base-dtype");

// `path` loaded for sampling: a model directory, checkpoint or .gguf as io::load_model loads it, or an
// adapter directory (is_adapter_dir) applied on its base (base_flag, else base.json's path).
// `model_dir` is where the tokenizer and chat template come from (the base for an adapter).
// `base_dtype` is how the (base) model holds its linear weights (QLoRA, policy.base_dtype): given,
// else an adapter's base.json "base_dtype" (what it was trained over), else fp32. gguf keeps a .gguf
// base's own blocks; bf16, q8_0 and q4_k quantize at load.
struct LoadedForSampling {
  policy::io::LoadedModel loaded;
  std::string model_dir;
  bool adapter = false;
};
Result<LoadedForSampling> load_for_sampling(const std::string& path, const std::string& base_flag,
                                            std::optional<policy::BaseDtype> base_dtype = std::nullopt);

}  // namespace troupe::serve
