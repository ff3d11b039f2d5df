// LoRA adapters on a loaded base (lora_adapters.h): find the base, check the adapter fits it, apply
// it as the model's own LoRA or as a served adapter. Invariant: every check runs before the model is
// changed, and each error names the file, key and value at fault.
#include "troupe/serve/lora_adapters.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "troupe/base/enum_names.h"
#include "troupe/policy/io/gguf_import.h"

namespace troupe::serve {

namespace fs = std::filesystem;
namespace io = policy::io;

bool is_adapter_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / io::kAdapterConfigFile, ec);
}

Result<io::AdapterBaseRef> adapter_base_ref(const std::string& dir, const std::string& base_flag,
                                            const std::string& flag_name) {
  if (!fs::is_directory(dir))
    return invalid_input(dir + ": not a directory (expected a LoRA checkpoint or PEFT adapter directory)");
  const std::string ref_file = (fs::path(dir) / io::kAdapterBaseFile).string();
  if (!base_flag.empty()) {
    io::AdapterBaseRef ref{base_flag, "", std::nullopt};
    if (fs::exists(ref_file)) {
      TROUPE_ASSIGN_OR_RETURN(auto recorded, io::read_adapter_base_ref(ref_file));
      ref.fingerprint = recorded.fingerprint;
      ref.base_dtype = recorded.base_dtype;
    }
    return ref;
  }
  if (!fs::exists(ref_file))
    return invalid_input(ref_file + ": missing (a troupe LoRA checkpoint records its base there; for another PEFT "
                         "adapter give " + flag_name + " PATH)");
  TROUPE_ASSIGN_OR_RETURN(auto ref, io::read_adapter_base_ref(ref_file));
  if (fs::path(ref.path).is_relative() && !fs::exists(ref.path) && fs::exists(fs::path(dir) / ref.path))
    ref.path = (fs::path(dir) / ref.path).string();
  return ref;
}

Result<std::string> adapter_base_dir(const std::string& path, const std::string& dir, bool from_flag) {
  const std::string from = from_flag ? " (--base)" : " (named by " + (fs::path(dir) / io::kAdapterBaseFile).string() + ")";
  if (!fs::exists(path)) return invalid_input(path + ": the base model does not exist" + from);
  if (fs::path(path).extension() == ".gguf") return io::cached_gguf_import(path);
  if (!fs::is_directory(path)) return invalid_input(path + ": the base model is not a directory or a .gguf file" + from);
  return path;
}

Result<std::string> base_fingerprint_of(const std::string& base_path, const policy::Model& base) {
  TROUPE_ASSIGN_OR_RETURN(std::string dir, io::model_dir_for(base_path));
  const std::string file = (fs::path(dir) / "config.json").string();
  std::ifstream in(file);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!in || j.is_discarded() || !j.is_object()) return invalid_input(file + ": missing or not a JSON object");
  return io::base_fingerprint(j, base.base_tensors());
}

Status check_base_fingerprint(const io::AdapterBaseRef& ref, const std::string& actual, const std::string& dir) {
  if (ref.fingerprint.empty() || ref.fingerprint == actual) return {};
  return invalid_input((fs::path(dir) / io::kAdapterBaseFile).string() + ": key 'fingerprint' is " + ref.fingerprint +
                       " but the base " + ref.path + " has " + actual +
                       " (its config.json or tensor shapes differ from the model the adapter was trained on)");
}

namespace {

// The modules' LoRA kinds (q k v o gate up down); a module of no such kind is an error.
Result<std::vector<policy::LoraTarget>> adapter_kinds(const io::PeftAdapter& a, const policy::Model& base) {
  const std::string file = (fs::path(a.dir) / io::kAdapterWeightsFile).string();
  const policy::ModelFamily family = base.config().family;
  std::set<policy::LoraTarget> kinds;
  for (const auto& m : a.modules()) {
    const std::string kind = io::lora_kind_of_module(family, m);
    auto t = enum_from_name<policy::LoraTarget>(kind);
    if (kind.empty() || !t || *t == policy::LoraTarget::experts)
      return invalid_input(file + ": adapts " + m +
                           ", which troupe does not apply LoRA to (attention q k v o and the dense MLP's gate up down)");
    kinds.insert(*t);
  }
  return std::vector<policy::LoraTarget>(kinds.begin(), kinds.end());
}

Status check_rank(const io::PeftAdapter& a, const policy::Model& base) {
  const std::string file = (fs::path(a.dir) / io::kAdapterConfigFile).string();
  for (const auto& m : a.modules()) {
    const policy::TensorSpec* t = base.find_base_tensor(m + ".weight");
    if (t == nullptr || t->shape.size() != 2) continue;  // read_peft_adapter names it
    const int64_t out = t->shape[0], in = t->shape[1];
    if (a.config.r > std::min(in, out))
      return invalid_input(file + ": key 'r' is " + std::to_string(a.config.r) + ", larger than min(in, out) = " +
                           std::to_string(std::min(in, out)) + " of " + m + " (in " + std::to_string(in) + ", out " +
                           std::to_string(out) + ")");
  }
  return {};
}

policy::LoraConfig lora_config_of(const io::PeftAdapter& a, std::vector<policy::LoraTarget> kinds) {
  policy::LoraConfig c;
  c.rank = static_cast<int>(a.config.r);
  c.alpha = static_cast<float>(a.config.lora_alpha);
  c.use_rslora = a.config.use_rslora;
  c.dropout = 0;  // inference: PEFT's dropout does nothing in eval mode
  c.targets = std::move(kinds);
  return c;
}

}  // namespace

Result<io::PeftAdapter> read_adapter_for(const std::string& dir, const io::AdapterBaseRef& ref,
                                         const policy::Model& base) {
  TROUPE_ASSIGN_OR_RETURN(std::string fingerprint, base_fingerprint_of(ref.path, base));
  TROUPE_TRY(check_base_fingerprint(ref, fingerprint, dir));
  TROUPE_ASSIGN_OR_RETURN(auto adapter, io::read_peft_adapter(dir, base.base_tensors()));
  TROUPE_TRY(check_rank(adapter, base));
  TROUPE_TRY(adapter_kinds(adapter, base));
  return adapter;
}

Status apply_adapter(policy::Model& model, const io::PeftAdapter& adapter) {
  TROUPE_ASSIGN_OR_RETURN(auto kinds, adapter_kinds(adapter, model));
  TROUPE_TRY(model.enable_lora(lora_config_of(adapter, std::move(kinds)), 0));
  std::vector<float> values(model.params().size(), 0.0f);
  size_t used = 0;
  for (const auto& s : model.tensors()) {
    auto it = adapter.tensors.find(s.name);
    if (it == adapter.tensors.end()) continue;  // a module of an adapted kind the adapter leaves alone: A = B = 0
    if (it->second.data.size() != s.numel())
      return invalid_input((fs::path(adapter.dir) / io::kAdapterWeightsFile).string() + ": tensor '" + s.name +
                           "' has another shape than the model's adapter");
    std::copy(it->second.data.begin(), it->second.data.end(), values.begin() + static_cast<std::ptrdiff_t>(s.offset));
    ++used;
  }
  if (used != adapter.tensors.size())
    return make_error(ErrorCode::internal, adapter.dir + ": " + std::to_string(adapter.tensors.size() - used) +
                                               " adapter tensors have no place in the model's LoRA table");
  return model.set_params(values);
}

Result<int> add_served_adapter(policy::Model& model, const io::PeftAdapter& adapter) {
  TROUPE_ASSIGN_OR_RETURN(auto kinds, adapter_kinds(adapter, model));
  policy::ServedAdapterWeights w;
  w.rank = static_cast<int>(adapter.config.r);
  w.scale = lora_config_of(adapter, std::move(kinds)).scale();  // as enable_lora computes it
  for (const auto& m : adapter.modules()) {
    policy::ServedAdapterWeights::Pair p;
    p.weight = m + ".weight";
    p.a = adapter.tensors.at(io::lora_a_name(m)).data;
    p.b = adapter.tensors.at(io::lora_b_name(m)).data;
    w.pairs.push_back(std::move(p));
  }
  auto id = model.add_served_adapter(w);
  if (!id.ok()) return invalid_input(adapter.dir + ": " + id.error().message);
  return id;
}

Result<policy::BaseDtype> parse_base_dtype(const std::string& name, const std::string& flag_name) {
  return io::base_dtype_named(name, flag_name);
}

namespace {

// The base of an adapter loaded in `d`: gguf keeps the .gguf's own blocks, so it loads the file
// itself (config and tokenizer from its import); any other dtype loads the model directory (a .gguf's
// import) and quantizes the projections as they are read.
Result<io::LoadedModel> load_adapter_base(const io::AdapterBaseRef& ref, const std::string& dir, policy::BaseDtype d,
                                          bool from_flag) {
  policy::ExecutionOptions x;
  x.base_dtype = d;
  if (d != policy::BaseDtype::gguf) {
    TROUPE_ASSIGN_OR_RETURN(std::string model_dir, adapter_base_dir(ref.path, dir, from_flag));
    return io::load_model(model_dir, x);
  }
  if (fs::path(ref.path).extension() != ".gguf")
    return invalid_input("base_dtype gguf keeps the blocks of a .gguf base, and " + ref.path + " is not one (" +
                         (from_flag ? std::string("--base") : (fs::path(dir) / io::kAdapterBaseFile).string()) +
                         "); give --base-dtype fp32, bf16, q8_0 or q4_k to quantize it at load");
  TROUPE_TRY(adapter_base_dir(ref.path, dir, from_flag));  // the file exists; its import is made
  return io::load_model(ref.path, x);
}

}  // namespace

Result<LoadedForSampling> load_for_sampling(const std::string& path, const std::string& base_flag,
                                            std::optional<policy::BaseDtype> base_dtype) {
  if (!is_adapter_dir(path)) {
    if (!base_flag.empty())
      return invalid_input("--base " + base_flag + ": only for an adapter directory, and " + path + " has no " +
                           io::kAdapterConfigFile);
    policy::ExecutionOptions x;
    x.base_dtype = base_dtype.value_or(policy::BaseDtype::fp32);
    TROUPE_ASSIGN_OR_RETURN(auto loaded, io::load_model(path, x));
    return LoadedForSampling{std::move(loaded), path, false};
  }
  TROUPE_ASSIGN_OR_RETURN(auto ref, adapter_base_ref(path, base_flag));
  TROUPE_TRY(io::read_peft_adapter(path));  // the adapter's own files before the (large) base
  const policy::BaseDtype d = base_dtype.value_or(ref.base_dtype.value_or(policy::BaseDtype::fp32));
  TROUPE_ASSIGN_OR_RETURN(auto loaded, load_adapter_base(ref, path, d, !base_flag.empty()));
  TROUPE_ASSIGN_OR_RETURN(auto adapter, read_adapter_for(path, ref, loaded.model));
  TROUPE_TRY(apply_adapter(loaded.model, adapter));
  return LoadedForSampling{std::move(loaded), ref.path, true};
}

}  // namespace troupe::serve
