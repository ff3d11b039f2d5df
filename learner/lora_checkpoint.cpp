// The PEFT-layout files of a LoRA checkpoint (lora_checkpoint.h): written from, and read back into,
// a Model's adapter arena. Invariant: tensor names and values pass through unchanged (fp32).
#include "troupe/learner/lora_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/policy/io/gguf_import.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/io/peft_adapter.h"
#include "troupe/policy/io/sharded_weights.h"

namespace troupe::learner {
namespace fs = std::filesystem;
namespace io = policy::io;

namespace {

io::PeftAdapterConfig peft_config_of(const policy::LoraConfig& l, const std::string& base_path) {
  io::PeftAdapterConfig c;
  c.r = l.rank;
  c.lora_alpha = l.alpha;
  c.lora_dropout = l.dropout;
  c.use_rslora = l.use_rslora;
  c.base_model_name_or_path = base_path;
  c.init_lora_weights = l.init == policy::LoraInit::gaussian ? nlohmann::json("gaussian") : nlohmann::json(true);
  return c;  // target_modules empty: write_peft_adapter fills in the adapted modules' full paths
}

// config.json of the base as `troupe export` reads it (a .gguf's cached import directory).
Result<nlohmann::json> base_hf_config(const std::string& base_path) {
  TROUPE_ASSIGN_OR_RETURN(std::string dir, io::model_dir_for(base_path));
  const std::string file = (fs::path(dir) / "config.json").string();
  std::ifstream in(file);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!in || j.is_discarded() || !j.is_object()) return invalid_input(file + ": missing or not a JSON object");
  return j;
}

Status check_same_settings(const io::PeftAdapter& a, const policy::LoraConfig& l) {
  const std::string file = (fs::path(a.dir) / io::kAdapterConfigFile).string();
  auto differs = [&](const char* key, const std::string& got, const std::string& want) {
    return invalid_input(file + ": key '" + key + "' is " + got + " but the run's policy.lora gives " + want +
                         " (resume or evaluate with the settings the adapter was trained with)");
  };
  if (a.config.r != l.rank) return differs("r", std::to_string(a.config.r), std::to_string(l.rank));
  if (std::abs(a.config.lora_alpha - static_cast<double>(l.alpha)) > 1e-6 * std::abs(a.config.lora_alpha))
    return differs("lora_alpha", std::to_string(a.config.lora_alpha), std::to_string(l.alpha));
  if (a.config.use_rslora != l.use_rslora)
    return differs("use_rslora", a.config.use_rslora ? "true" : "false", l.use_rslora ? "true" : "false");
  return {};
}

}  // namespace

Status write_lora_adapter_files(const std::string& dir, const policy::Model& model, const std::string& base_path,
                                bool with_weights) {
  if (!model.lora_enabled()) return make_error(ErrorCode::internal, "write_lora_adapter_files: the model has no adapters");
  const auto config = peft_config_of(model.config().lora, base_path);
  if (with_weights)
    TROUPE_TRY(io::write_peft_adapter(dir, config, model.tensors(), model.params()));
  else
    TROUPE_TRY(io::write_peft_adapter_config(dir, config, model.tensors()));
  if (base_path.empty()) return {};
  TROUPE_ASSIGN_OR_RETURN(auto hf_config, base_hf_config(base_path));
  const std::string abs = fs::absolute(base_path).lexically_normal().string();
  io::AdapterBaseRef ref{abs, io::base_fingerprint(hf_config, model.base_tensors()), std::nullopt};
  if (model.base_quantized()) ref.base_dtype = model.config().base_dtype;  // generate / serve load the base so
  return io::write_adapter_base_ref((fs::path(dir) / io::kAdapterBaseFile).string(), ref);
}

Status read_lora_adapter_files(const std::string& dir, policy::Model& model) {
  if (!model.lora_enabled())
    return invalid_input(dir + ": holds a LoRA adapter, but policy.lora.rank is 0 (set the run's policy.lora)");
  TROUPE_ASSIGN_OR_RETURN(auto adapter, io::read_peft_adapter(dir, model.base_tensors()));
  TROUPE_TRY(check_same_settings(adapter, model.config().lora));
  std::string file = (fs::path(dir) / io::kAdapterWeightsFile).string();
  if (!fs::exists(file)) file = (fs::path(dir) / io::kShardManifestFile).string();  // a sharded checkpoint's
  std::vector<float> values(model.params().size());
  for (const auto& s : model.tensors()) {
    auto it = adapter.tensors.find(s.name);
    if (it == adapter.tensors.end())
      return invalid_input(file + ": no tensor '" + s.name + "' (the adapter covers other modules than policy.lora.targets)");
    if (it->second.shape != s.shape || it->second.data.size() != s.numel())
      return invalid_input(file + ": tensor '" + s.name + "' has another shape than the run's adapter");
    std::copy(it->second.data.begin(), it->second.data.end(), values.begin() + static_cast<std::ptrdiff_t>(s.offset));
  }
  if (adapter.tensors.size() != model.tensors().size())
    return invalid_input(file + ": holds " + std::to_string(adapter.tensors.size()) + " tensors, the run's adapter " +
                         std::to_string(model.tensors().size()) + " (other policy.lora.targets)");
  return model.set_params(values);
}

}  // namespace troupe::learner
