// PEFT LoRA adapter files (peft_adapter.h): adapter_config.json <-> PeftAdapterConfig and the LoRA
// pairs of adapter_model.safetensors. Invariant: what is read computes W + s·B·A and nothing else;
// every key or tensor that would change that is an error naming the file and the key or tensor.
#include "troupe/policy/io/peft_adapter.h"
#include "troupe/policy/io/sharded_weights.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace troupe::policy::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kPrefix = "base_model.model.";
constexpr std::string_view kSuffixA = ".lora_A.weight";
constexpr std::string_view kSuffixB = ".lora_B.weight";

bool ends_with(std::string_view s, std::string_view t) {
  return s.size() >= t.size() && s.substr(s.size() - t.size()) == t;
}

// A value PEFT uses for "feature off": null, false, "", [] or {}.
bool is_neutral(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>().empty()) ||
         ((v.is_array() || v.is_object()) && v.empty());
}

// Keys whose value never changes the merged weights (bookkeeping, or what the tensors already say).
const std::set<std::string>& neutral_keys() {
  static const std::set<std::string> k = {
      "base_model_name_or_path", "revision", "inference_mode", "auto_mapping", "peft_version", "lora_dropout",
      "target_modules", "exclude_modules", "layers_to_transform", "layers_pattern", "megatron_core",
      "qalora_group_size", "loftq_config", "eva_config", "corda_config", "ensure_weight_tying",
      "r", "lora_alpha", "use_rslora", "init_lora_weights", "bias", "peft_type", "task_type"};
  return k;
}

// Keys that change the math unless neutral (false / null / empty), with what they would do.
const std::map<std::string, std::string>& math_keys() {
  static const std::map<std::string, std::string> k = {
      {"use_dora", "DoRA (weight-decomposed LoRA)"},
      {"lora_bias", "a bias on lora_B"},
      {"fan_in_fan_out", "transposed (Conv1D) base weights"},
      {"use_qalora", "QA-LoRA pooling"},
      {"modules_to_save", "fully trained extra modules"},
      {"layer_replication", "replicated layers"},
      {"rank_pattern", "per-module ranks"},
      {"alpha_pattern", "per-module alphas"},
      {"target_parameters", "LoRA on parameters (not modules)"},
      {"trainable_token_indices", "trained token embeddings"},
      {"megatron_config", "Megatron-parallel layers"},
      {"alora_invocation_tokens", "activated LoRA"},
      {"arrow_config", "Arrow routing"},
  };
  return k;
}

Error bad_key(const std::string& file, const std::string& key, const std::string& why) {
  return invalid_input(file + ": key '" + key + "' " + why);
}

template <class T>
Result<T> get_as(const json& j, const std::string& key, const std::string& file, const char* type) {
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    return bad_key(file, key, std::string("must be ") + type + " (got " + j.at(key).dump() + ")");
  }
}

Status check_init(const json& v, const std::string& file) {
  if (v.is_boolean()) return {};
  if (v.is_string()) {
    const auto s = v.get<std::string>();
    if (s == "gaussian" || s == "eva") return {};
    return bad_key(file, "init_lora_weights",
                   "is \"" + s + "\": only true, false, \"gaussian\" and \"eva\" are supported (an init such as "
                   "PiSSA, OLoRA, CorDA or LoftQ changes the base weights the adapter belongs to)");
  }
  return bad_key(file, "init_lora_weights", "must be a boolean or a string (got " + v.dump() + ")");
}

Status parse_targets(const json& j, PeftAdapterConfig& c, const std::string& file) {
  if (!j.contains("target_modules") || j["target_modules"].is_null()) return {};
  const json& t = j["target_modules"];
  if (t.is_string()) {
    c.target_modules_regex = t.get<std::string>();
    return {};
  }
  if (!t.is_array()) return bad_key(file, "target_modules", "must be a list or a string (got " + t.dump() + ")");
  for (const auto& x : t) {
    if (!x.is_string()) return bad_key(file, "target_modules", "must hold strings (got " + x.dump() + ")");
    c.target_modules.push_back(x.get<std::string>());
  }
  std::sort(c.target_modules.begin(), c.target_modules.end());
  return {};
}

Status check_math_keys(const json& j, const std::string& file) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (neutral_keys().count(key)) continue;
    if (auto m = math_keys().find(key); m != math_keys().end()) {
      if (!is_neutral(it.value()))
        return bad_key(file, key, "is " + it.value().dump() + ": " + m->second + " is not supported (troupe merges plain LoRA, W + s·B·A)");
      continue;
    }
    if (!is_neutral(it.value()))
      return bad_key(file, key, "is unknown to troupe and set (" + it.value().dump() + "); it may change what the adapter computes");
  }
  return {};
}

Result<PeftAdapterConfig> config_from_json(const json& j, const std::string& file) {
  if (!j.is_object()) return invalid_input(file + ": not a JSON object");
  TROUPE_TRY(check_math_keys(j, file));
  PeftAdapterConfig c;
  for (const char* key : {"r", "lora_alpha", "peft_type"})
    if (!j.contains(key)) return invalid_input(file + ": missing key '" + std::string(key) + "'");
  TROUPE_ASSIGN_OR_RETURN(c.peft_type, get_as<std::string>(j, "peft_type", file, "a string"));
  if (c.peft_type != "LORA") return bad_key(file, "peft_type", "is \"" + c.peft_type + "\": only LORA adapters are supported");
  TROUPE_ASSIGN_OR_RETURN(c.r, get_as<int64_t>(j, "r", file, "an integer"));
  if (c.r <= 0) return bad_key(file, "r", "must be > 0 (got " + std::to_string(c.r) + ")");
  TROUPE_ASSIGN_OR_RETURN(c.lora_alpha, get_as<double>(j, "lora_alpha", file, "a number"));
  if (j.contains("lora_dropout") && !j["lora_dropout"].is_null()) {
    TROUPE_ASSIGN_OR_RETURN(c.lora_dropout, get_as<double>(j, "lora_dropout", file, "a number"));
  }
  if (j.contains("use_rslora") && !j["use_rslora"].is_null()) {
    TROUPE_ASSIGN_OR_RETURN(c.use_rslora, get_as<bool>(j, "use_rslora", file, "a boolean"));
  }
  if (j.contains("bias") && !j["bias"].is_null()) {
    TROUPE_ASSIGN_OR_RETURN(c.bias, get_as<std::string>(j, "bias", file, "a string"));
    if (c.bias != "none") return bad_key(file, "bias", "is \"" + c.bias + "\": only \"none\" is supported (trained biases change the model)");
  }
  if (j.contains("task_type") && !j["task_type"].is_null()) {
    TROUPE_ASSIGN_OR_RETURN(c.task_type, get_as<std::string>(j, "task_type", file, "a string"));
    if (c.task_type != "CAUSAL_LM") return bad_key(file, "task_type", "is \"" + c.task_type + "\": only CAUSAL_LM is supported");
  }
  if (j.contains("init_lora_weights")) {
    TROUPE_TRY(check_init(j["init_lora_weights"], file));
    c.init_lora_weights = j["init_lora_weights"];
  }
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
    c.base_model_name_or_path = j["base_model_name_or_path"].get<std::string>();
  TROUPE_TRY(parse_targets(j, c, file));
  return c;
}

// adapter_config.json as peft 0.21 writes it: every LoraConfig field, the unused ones at their defaults.
json config_to_json(const PeftAdapterConfig& c) {
  json j = {{"alora_invocation_tokens", nullptr}, {"alpha_pattern", json::object()}, {"arrow_config", nullptr},
            {"auto_mapping", nullptr}, {"base_model_name_or_path", c.base_model_name_or_path.empty() ? json(nullptr) : json(c.base_model_name_or_path)},
            {"bias", c.bias}, {"corda_config", nullptr}, {"ensure_weight_tying", false}, {"eva_config", nullptr},
            {"exclude_modules", nullptr}, {"fan_in_fan_out", false}, {"inference_mode", true},
            {"init_lora_weights", c.init_lora_weights}, {"kasa_config", nullptr}, {"layer_replication", nullptr},
            {"layers_pattern", nullptr}, {"lora_ga_config", nullptr}, {"monteclora_config", nullptr},
            {"layers_to_transform", nullptr}, {"loftq_config", json::object()}, {"lora_alpha", c.lora_alpha},
            {"lora_bias", false}, {"lora_dropout", c.lora_dropout}, {"megatron_config", nullptr},
            {"megatron_core", "megatron.core"}, {"modules_to_save", nullptr}, {"peft_type", c.peft_type},
            {"qalora_group_size", 16}, {"r", c.r}, {"rank_pattern", json::object()}, {"revision", nullptr},
            {"target_parameters", nullptr}, {"task_type", c.task_type}, {"trainable_token_indices", nullptr},
            {"use_bdlora", nullptr}, {"use_dora", false}, {"use_qalora", false}, {"use_rslora", c.use_rslora},
            {"velora_config", nullptr}};
  // An integral alpha is written as PEFT writes it (8, not 8.0).
  if (c.lora_alpha == std::floor(c.lora_alpha) && std::fabs(c.lora_alpha) < 1e15)
    j["lora_alpha"] = static_cast<int64_t>(c.lora_alpha);
  if (!c.target_modules_regex.empty()) j["target_modules"] = c.target_modules_regex;
  else j["target_modules"] = c.target_modules;
  return j;
}

// Every tensor is half of a pair of rank r; both halves are there. `what` names the source in errors.
Status check_pairs(const PeftAdapterConfig& c, const TensorMap& tensors, const std::string& what) {
  std::map<std::string, int> seen;  // module -> bit 1 = A, bit 2 = B
  for (const auto& [name, t] : tensors) {
    auto parsed = parse_lora_tensor_name(name);
    if (!parsed.ok()) return invalid_input(what + ": " + parsed.error().message);
    const auto& [module, half] = parsed.value();
    if (t.shape.size() != 2) return invalid_input(what + ": tensor '" + name + "' has shape " + shape_string(t.shape) + ", expected 2 dimensions");
    const int64_t rank_dim = half == 'A' ? t.shape[0] : t.shape[1];
    if (rank_dim != c.r)
      return invalid_input(what + ": tensor '" + name + "' has shape " + shape_string(t.shape) + " but r is " +
                           std::to_string(c.r) + (half == 'A' ? " (lora_A is (r, in_features))" : " (lora_B is (out_features, r))"));
    seen[module] |= half == 'A' ? 1 : 2;
  }
  for (const auto& [module, bits] : seen)
    if (bits != 3)
      return invalid_input(what + ": tensor '" + (bits == 1 ? lora_b_name(module) : lora_a_name(module)) + "' is missing (the pair of '" +
                           (bits == 1 ? lora_a_name(module) : lora_b_name(module)) + "')");
  if (seen.empty()) return invalid_input(what + ": no LoRA tensors");
  return {};
}

Status write_text(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out) return make_error(ErrorCode::io, tmp + ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return make_error(ErrorCode::io, path.string() + ": cannot rename (" + ec.message() + ")");
  return {};
}

}  // namespace

double PeftAdapterConfig::scaling() const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r)) : lora_alpha / static_cast<double>(r);
}

std::string lora_a_name(std::string_view module) { return std::string(kPrefix) + std::string(module) + std::string(kSuffixA); }
std::string lora_b_name(std::string_view module) { return std::string(kPrefix) + std::string(module) + std::string(kSuffixB); }

Result<std::pair<std::string, char>> parse_lora_tensor_name(std::string_view name) {
  const bool a = ends_with(name, kSuffixA), b = ends_with(name, kSuffixB);
  if (name.substr(0, kPrefix.size()) != kPrefix || (!a && !b))
    return invalid_input("tensor '" + std::string(name) + "' is not a LoRA weight (expected base_model.model.<module>.lora_A.weight or .lora_B.weight)");
  std::string module(name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffixA.size()));
  if (module.empty()) return invalid_input("tensor '" + std::string(name) + "' names no module");
  return std::make_pair(std::move(module), a ? 'A' : 'B');
}

std::vector<std::string> PeftAdapter::modules() const {
  std::set<std::string> m;
  for (const auto& [name, t] : tensors)
    if (auto p = parse_lora_tensor_name(name); p.ok()) m.insert(p.value().first);
  return {m.begin(), m.end()};
}

Status write_peft_adapter(const std::string& dir, const PeftAdapterConfig& config, std::span<const TensorSpec> tensors,
                          std::span<const float> values) {
  TensorMap out;
  for (const TensorSpec& s : tensors) {
    if (s.offset + s.numel() > values.size())
      return make_error(ErrorCode::internal, "write_peft_adapter: tensor '" + s.name + "' lies past the end of the values");
    const float* src = values.data() + s.offset;
    out[s.name] = Tensor{s.shape, std::vector<float>(src, src + s.numel())};
  }
  TROUPE_TRY(check_pairs(config, out, "write_peft_adapter(" + dir + ")"));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io, dir + ": cannot create directory (" + ec.message() + ")");
  TROUPE_TRY(write_safetensors((fs::path(dir) / kAdapterWeightsFile).string(), out, {{"format", "pt"}}));
  return write_peft_adapter_config(dir, config, tensors);
}

Status write_peft_adapter_config(const std::string& dir, const PeftAdapterConfig& config,
                                 std::span<const TensorSpec> tensors) {
  PeftAdapterConfig c = config;
  if (c.target_modules.empty() && c.target_modules_regex.empty()) {
    std::set<std::string> modules;
    for (const TensorSpec& s : tensors) {
      TROUPE_ASSIGN_OR_RETURN(auto parsed, parse_lora_tensor_name(s.name));
      modules.insert(parsed.first);
    }
    c.target_modules.assign(modules.begin(), modules.end());
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io, dir + ": cannot create directory (" + ec.message() + ")");
  return write_text(fs::path(dir) / kAdapterConfigFile, config_to_json(c).dump(2) + "\n");
}

Status check_adapter_base(const PeftAdapter& adapter, std::span<const TensorSpec> base) {
  std::map<std::string_view, const TensorSpec*> by_name;
  for (const TensorSpec& s : base) by_name[s.name] = &s;
  const std::string what = adapter.dir.empty() ? std::string("adapter") : (fs::path(adapter.dir) / kAdapterWeightsFile).string();
  for (const std::string& module : adapter.modules()) {
    const std::string weight = module + ".weight";
    auto it = by_name.find(weight);
    const bool excluded = module == "model.embed_tokens" || module == "lm_head";
    if (it == by_name.end() || excluded || it->second->shape.size() != 2)
      return invalid_input(what + ": tensor '" + lora_a_name(module) + "' adapts '" + module +
                           "', which is not a linear projection of the base model (no 2-D '" + weight + "'" +
                           (excluded ? ", or the embedding / head" : "") + ")");
    const auto& ws = it->second->shape;
    const Tensor& a = adapter.tensors.at(lora_a_name(module));
    const Tensor& b = adapter.tensors.at(lora_b_name(module));
    if (a.shape[1] != ws[1])
      return invalid_input(what + ": tensor '" + lora_a_name(module) + "' has shape " + shape_string(a.shape) + " but the base's '" +
                           weight + "' is " + shape_string(ws) + " (lora_A must be (r, " + std::to_string(ws[1]) + "))");
    if (b.shape[0] != ws[0])
      return invalid_input(what + ": tensor '" + lora_b_name(module) + "' has shape " + shape_string(b.shape) + " but the base's '" +
                           weight + "' is " + shape_string(ws) + " (lora_B must be (" + std::to_string(ws[0]) + ", r))");
  }
  return {};
}

Result<PeftAdapter> read_peft_adapter(const std::string& dir, std::span<const TensorSpec> base) {
  PeftAdapter a;
  a.dir = dir;
  const std::string cfg_file = (fs::path(dir) / kAdapterConfigFile).string();
  const std::string weights_file = (fs::path(dir) / kAdapterWeightsFile).string();
  if (!fs::is_directory(dir)) return invalid_input(dir + ": not a directory (expected a LoRA adapter: " + kAdapterConfigFile + " + " + kAdapterWeightsFile + ")");
  std::ifstream in(cfg_file);
  if (!in) return invalid_input(cfg_file + ": cannot open (a LoRA adapter directory holds " + kAdapterConfigFile + ")");
  try {
    a.raw_config = json::parse(in);
  } catch (const json::parse_error& e) {
    return invalid_input(cfg_file + ": not valid JSON (" + e.what() + ")");
  }
  TROUPE_ASSIGN_OR_RETURN(a.config, config_from_json(a.raw_config, cfg_file));
  if (!fs::exists(weights_file) && has_shard_manifest(dir)) {  // a sharded learner's LoRA checkpoint
    TROUPE_ASSIGN_OR_RETURN(auto m, read_shard_manifest(dir));
    if (m.kind != "lora_adapter") return invalid_input(m.path + ": holds a whole model's weights, not LoRA adapters");
    TROUPE_ASSIGN_OR_RETURN(a.tensors, read_sharded_tensors(dir, m));
    TROUPE_TRY(check_pairs(a.config, a.tensors, m.path));
  } else {
    if (!fs::exists(weights_file)) return invalid_input(weights_file + ": missing (the adapter's weights; a .bin adapter must be converted to safetensors)");
    TROUPE_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(weights_file));
    for (const auto& e : file.entries()) {
      TROUPE_ASSIGN_OR_RETURN(auto t, file.read(e.name));
      a.tensors[e.name] = std::move(t);
    }
    TROUPE_TRY(check_pairs(a.config, a.tensors, weights_file));
  }
  if (!base.empty()) TROUPE_TRY(check_adapter_base(a, base));
  return a;
}

}  // namespace troupe::policy::io
