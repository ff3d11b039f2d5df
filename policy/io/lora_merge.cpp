// Merging a PEFT LoRA adapter into base weights (W <- W + s·B·A) and the base identity an adapter
// records (base_fingerprint, base.json). Invariant: the merge is fp32, in a fixed order, and changes
// nothing unless the whole adapter fits the base.
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "troupe/base/enum_names.h"
#include "troupe/policy/io/peft_adapter.h"

namespace troupe::policy::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// W (out, in) += s · B (out, r) · A (r, in); each B·A entry summed in double and rounded once to
// fp32, then scaled in fp32 and added, as PEFT's (B @ A) * scaling then W += delta.
void add_scaled_product(float* w, const Tensor& a, const Tensor& b, float s) {
  const int64_t r = a.shape[0], in = a.shape[1], out = b.shape[0];
  for (int64_t o = 0; o < out; ++o) {
    const float* brow = b.data.data() + o * r;
    float* wrow = w + o * in;
    for (int64_t i = 0; i < in; ++i) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) acc += static_cast<double>(brow[k]) * static_cast<double>(a.data[k * in + i]);
      wrow[i] += static_cast<float>(acc) * s;
    }
  }
}

std::vector<TensorSpec> specs_of(const TensorMap& base) {
  std::vector<TensorSpec> specs;
  specs.reserve(base.size());
  for (const auto& [name, t] : base) specs.push_back(TensorSpec{name, t.shape, 0});
  return specs;
}

}  // namespace

Status merge_lora(TensorMap& base, const PeftAdapter& adapter) {
  const auto specs = specs_of(base);
  TROUPE_TRY(check_adapter_base(adapter, specs));
  const float s = static_cast<float>(adapter.config.scaling());
  for (const std::string& module : adapter.modules())
    add_scaled_product(base.at(module + ".weight").data.data(), adapter.tensors.at(lora_a_name(module)),
                       adapter.tensors.at(lora_b_name(module)), s);
  return {};
}

Status merge_lora(std::span<float> params, std::span<const TensorSpec> specs, const PeftAdapter& adapter) {
  TROUPE_TRY(check_adapter_base(adapter, specs));
  std::map<std::string_view, const TensorSpec*> by_name;
  for (const TensorSpec& s : specs) {
    if (s.offset + s.numel() > params.size())
      return make_error(ErrorCode::internal, "merge_lora: tensor '" + s.name + "' lies past the end of the parameters");
    by_name[s.name] = &s;
  }
  const float s = static_cast<float>(adapter.config.scaling());
  for (const std::string& module : adapter.modules())
    add_scaled_product(params.data() + by_name.at(module + ".weight")->offset, adapter.tensors.at(lora_a_name(module)),
                       adapter.tensors.at(lora_b_name(module)), s);
  return {};
}

std::string base_fingerprint(const json& hf_config, std::span<const TensorSpec> tensors) {
  std::vector<const TensorSpec*> sorted;
  for (const TensorSpec& t : tensors)
    if (t.name.find(".lora_A.") == std::string::npos && t.name.find(".lora_B.") == std::string::npos) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const TensorSpec* a, const TensorSpec* b) { return a->name < b->name; });
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const std::string cfg = hf_config.dump();  // keys sorted (nlohmann's object is a std::map)
  XXH3_64bits_update(st, cfg.data(), cfg.size() + 1);
  for (const TensorSpec* t : sorted) {
    XXH3_64bits_update(st, t->name.data(), t->name.size() + 1);
    const uint64_t rank = t->shape.size();
    XXH3_64bits_update(st, &rank, sizeof rank);
    XXH3_64bits_update(st, t->shape.data(), t->shape.size() * sizeof(int64_t));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  char buf[32];
  std::snprintf(buf, sizeof buf, "xxh3:%016" PRIx64, h);
  return buf;
}

Result<BaseDtype> base_dtype_named(std::string_view name, const std::string& what) {
  if (auto d = enum_from_name<BaseDtype>(name)) return *d;
  std::string names;
  for (const auto& [n, v] : EnumNames<BaseDtype>::table) names += (names.empty() ? "" : ", ") + std::string(n);
  return invalid_input(what + " is \"" + std::string(name) + "\", expected one of " + names);
}

Result<AdapterBaseRef> read_adapter_base_ref(const std::string& file) {
  std::ifstream in(file);
  if (!in) return invalid_input(file + ": cannot open (the base reference of a LoRA checkpoint; or give --base PATH)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    return invalid_input(file + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) return invalid_input(file + ": not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "path" && it.key() != "fingerprint" && it.key() != "base_dtype")
      return invalid_input(file + ": unknown key '" + it.key() +
                           "' (base.json holds \"path\", \"fingerprint\" and \"base_dtype\")");
  if (!j.contains("path") || !j["path"].is_string() || j["path"].get<std::string>().empty())
    return invalid_input(file + ": key 'path' must be a non-empty string (the base model directory or .gguf file)");
  AdapterBaseRef ref;
  ref.path = j["path"].get<std::string>();
  if (j.contains("fingerprint") && !j["fingerprint"].is_null()) {
    if (!j["fingerprint"].is_string()) return invalid_input(file + ": key 'fingerprint' must be a string");
    ref.fingerprint = j["fingerprint"].get<std::string>();
  }
  if (j.contains("base_dtype") && !j["base_dtype"].is_null()) {
    const json& d = j["base_dtype"];
    TROUPE_ASSIGN_OR_RETURN(ref.base_dtype, base_dtype_named(d.is_string() ? d.get<std::string>() : d.dump(),
                                                             file + ": key 'base_dtype' (the policy.base_dtype the "
                                                                    "adapter was trained over)"));
  }
  return ref;
}

Status write_adapter_base_ref(const std::string& file, const AdapterBaseRef& ref) {
  json j = {{"path", ref.path}, {"fingerprint", ref.fingerprint.empty() ? json(nullptr) : json(ref.fingerprint)}};
  if (ref.base_dtype) j["base_dtype"] = enum_string(*ref.base_dtype);
  const std::string tmp = file + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) return make_error(ErrorCode::io, tmp + ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) return make_error(ErrorCode::io, file + ": cannot rename (" + ec.message() + ")");
  return {};
}

}  // namespace troupe::policy::io
