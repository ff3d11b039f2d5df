// load_reward_model (reward_model_dir.h): config.json's architecture and labels checked, score.weight
// split off, the decoder's tensors loaded through the causal-LM path with the head tied away.
// Invariant: every refusal names the file and the key or tensor at fault.
#include "troupe/policy/io/reward_model_dir.h"

#include <filesystem>
#include <fstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "troupe/base/enum_names.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/safetensors.h"

namespace troupe::policy::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Architecture {
  std::string_view name;
  ModelFamily family;
};
constexpr Architecture kArchitectures[] = {
    {"LlamaForSequenceClassification", ModelFamily::llama},
    {"Qwen2ForSequenceClassification", ModelFamily::qwen2},
    {"Qwen3ForSequenceClassification", ModelFamily::qwen3},
};

Result<json> read_config(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  if (!fs::is_directory(dir)) return invalid_input(dir + ": not a model directory (does not exist or is not a directory)");
  std::ifstream in(file);
  if (!in) return invalid_input(file + ": missing config.json in reward model directory " + dir);
  try {
    json j = json::parse(in);
    if (!j.is_object()) return invalid_input(file + ": not a JSON object");
    return j;
  } catch (const json::exception& e) {
    return invalid_input(file + ": not valid JSON: " + e.what());
  }
}

// architectures[0] must be supported and agree with model_type (already read into cfg.family).
Result<std::string> check_architecture(const json& j, const ModelConfig& cfg, const std::string& file) {
  if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
      !j["architectures"][0].is_string())
    return invalid_input(file + ": key 'architectures' is missing or not a list of names; a reward model needs one of " +
                         supported_reward_architectures());
  const std::string arch = j["architectures"][0].get<std::string>();
  for (const Architecture& a : kArchitectures) {
    if (arch != a.name) continue;
    if (cfg.family != a.family)
      return invalid_input(file + ": key 'architectures' is " + arch + " but 'model_type' is " +
                           std::string(enum_string(cfg.family)) + " (expected " + std::string(enum_string(a.family)) + ")");
    return arch;
  }
  return invalid_input(file + ": key 'architectures' is '" + arch + "', not a supported sequence-classification model (" +
                       supported_reward_architectures() + ")");
}

// transformers: num_labels = len(id2label) when config.json has id2label, else num_labels, else 2.
Result<int> read_num_labels(const json& j, const std::string& file) {
  if (j.contains("id2label") && j["id2label"].is_object() && !j["id2label"].empty())
    return static_cast<int>(j["id2label"].size());
  if (j.contains("num_labels") && !j["num_labels"].is_null()) {
    if (!j["num_labels"].is_number_integer() || j["num_labels"].get<int64_t>() < 1 || j["num_labels"].get<int64_t>() > 1 << 20)
      return invalid_input(file + ": key 'num_labels' must be a positive integer (got " + j["num_labels"].dump() + ")");
    return j["num_labels"].get<int>();
  }
  return 2;
}

Result<int32_t> read_pad_token_id(const json& j, const std::string& file, int vocab_size) {
  if (!j.contains("pad_token_id") || j["pad_token_id"].is_null()) return -1;
  const json& v = j["pad_token_id"];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size)
    return invalid_input(file + ": key 'pad_token_id' must be null or a token id in 0.." + std::to_string(vocab_size - 1) +
                         " (got " + v.dump() + ")");
  return v.get<int32_t>();
}

int32_t token_id(const json& j, const char* key) {
  if (!j.contains(key)) return -1;
  const json& v = j[key];
  if (v.is_number_integer()) return v.get<int32_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int32_t>();
  return -1;
}

// score.weight's presence and shape, no score.bias (the files' headers only).
Status check_head(const WeightSource& w, const ModelConfig& cfg, int num_labels) {
  const SafetensorsEntry* e = w.find("score.weight");
  if (!e)
    return invalid_input(w.describe() + ": missing tensor 'score.weight' (the sequence-classification head, " +
                         std::to_string(num_labels) + " x " + std::to_string(cfg.hidden_size) + ")");
  const std::vector<int64_t> want = {num_labels, cfg.hidden_size};
  if (e->shape != want)
    return invalid_input(w.file_of("score.weight") + ": tensor 'score.weight' has shape " + shape_string(e->shape) +
                         ", expected " + shape_string(want) + " (num_labels x hidden_size of config.json)");
  if (w.contains("score.bias"))
    return invalid_input(w.file_of("score.bias") + ": unexpected tensor 'score.bias' (transformers' score layer has no bias)");
  return {};
}

// score.weight out of the weights, the rest canonicalized as a causal LM's decoder.
Status read_weights(const std::string& dir, const ModelConfig& cfg, ScoreHead* head, TensorMap* decoder) {
  TROUPE_ASSIGN_OR_RETURN(auto w, WeightSource::open_dir(dir));
  TROUPE_TRY(check_head(w, cfg, head->num_labels));
  const SafetensorsEntry* e = w.find("score.weight");
  TROUPE_ASSIGN_OR_RETURN(Tensor score, w.read("score.weight", e->shape));
  head->weight = std::move(score.data);
  head->hidden_size = cfg.hidden_size;
  TROUPE_ASSIGN_OR_RETURN(TensorMap all, w.read_all());
  all.erase("score.weight");
  TROUPE_ASSIGN_OR_RETURN(*decoder, canonicalize_tensors(cfg, all, w.describe()));
  return {};
}

}  // namespace

Status check_reward_model_dir(const std::string& path) {
  TROUPE_ASSIGN_OR_RETURN(json j, read_config(path));
  const std::string file = (fs::path(path) / "config.json").string();
  TROUPE_ASSIGN_OR_RETURN(ModelConfig cfg, config_from_hf_json(j, file));
  TROUPE_TRY(check_architecture(j, cfg, file));
  TROUPE_ASSIGN_OR_RETURN(int num_labels, read_num_labels(j, file));
  TROUPE_TRY(read_pad_token_id(j, file, cfg.vocab_size));
  TROUPE_ASSIGN_OR_RETURN(auto w, WeightSource::open_dir(path));
  return check_head(w, cfg, num_labels);
}

const char* supported_reward_architectures() {
  return "LlamaForSequenceClassification, Qwen2ForSequenceClassification, Qwen3ForSequenceClassification";
}

Result<RewardModelDir> load_reward_model(const std::string& path, const ExecutionOptions& exec) {
  TROUPE_ASSIGN_OR_RETURN(json j, read_config(path));
  const std::string file = (fs::path(path) / "config.json").string();
  ModelDir dir;
  dir.path = path;
  TROUPE_ASSIGN_OR_RETURN(dir.config, config_from_hf_json(j, file));
  dir.config.tie_word_embeddings = true;  // no LM head: the decoder's output goes to the score head only
  TROUPE_ASSIGN_OR_RETURN(std::string architecture, check_architecture(j, dir.config, file));
  ScoreHead head;
  TROUPE_ASSIGN_OR_RETURN(head.num_labels, read_num_labels(j, file));
  TROUPE_ASSIGN_OR_RETURN(head.pad_token_id, read_pad_token_id(j, file, dir.config.vocab_size));
  TROUPE_TRY(read_weights(path, dir.config, &head, &dir.tensors));
  TROUPE_ASSIGN_OR_RETURN(Model model, model_from_dir(dir, exec));
  RewardModelDir out{path, std::move(architecture), std::move(model), std::move(head), nullptr, "", -1, -1};
  if (fs::exists(fs::path(path) / kHfTokenizerFile) || fs::exists(fs::path(path) / kTroupeTokenizerFile)) {
    TROUPE_ASSIGN_OR_RETURN(out.tokenizer, load_tokenizer_dir(path));
  }
  TROUPE_ASSIGN_OR_RETURN(out.chat_template, read_chat_template_dir(path));
  out.bos_token_id = token_id(j, "bos_token_id");
  out.eos_token_id = token_id(j, "eos_token_id");
  if (out.tokenizer) {
    if (out.bos_token_id < 0) out.bos_token_id = out.tokenizer->bos_id();
    if (out.eos_token_id < 0) out.eos_token_id = out.tokenizer->eos_id();
  }
  return out;
}

}  // namespace troupe::policy::io
