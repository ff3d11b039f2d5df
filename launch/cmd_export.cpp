// `troupe export CKPT OUT_DIR [--merge] [--base PATH]`: a LoRA checkpoint (PEFT adapter files +
// base.json) or any PEFT adapter directory, either copied in PEFT layout with base.json, or merged
// into its base and written as a Hugging Face model directory. The base's fingerprint must match
// the one recorded; bad input is exit 2 naming the file and key.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "troupe/launch/commands.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/peft_adapter.h"
#include "troupe/serve/lora_adapters.h"

namespace troupe::launch {

namespace {

namespace fs = std::filesystem;
namespace io = policy::io;

// Files of a model directory that are not weights or config.json, copied as they are.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "troupe_tokenizer.json", "tokenizer_config.json",
                                           "special_tokens_map.json", "chat_template.jinja", "generation_config.json"};

struct ExportOpts {
  std::string ckpt, out, base;
  bool merge = false;
};

Result<nlohmann::json> read_json_file(const std::string& file) {
  std::ifstream in(file);
  if (!in) return invalid_input(file + ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_input(file + ": not valid JSON (" + e.what() + ")");
  }
}

Status require_empty_out(const std::string& out) {
  std::error_code ec;
  if (fs::exists(out) && !fs::is_empty(out, ec)) return invalid_input(out + ": exists and is not empty (export writes a new directory)");
  fs::create_directories(out, ec);
  if (ec) return make_error(ErrorCode::io, out + ": cannot create directory (" + ec.message() + ")");
  return {};
}

// The adapter's tensors as one flat buffer and its table, for write_peft_adapter.
void flatten(const io::TensorMap& tensors, std::vector<policy::TensorSpec>& specs, std::vector<float>& values) {
  for (const auto& [name, t] : tensors) {
    specs.push_back(policy::TensorSpec{name, t.shape, values.size()});
    values.insert(values.end(), t.data.begin(), t.data.end());
  }
}

Status copy_tokenizer_files(const std::string& from, const std::string& to) {
  for (const char* name : kTokenizerFiles) {
    const fs::path src = fs::path(from) / name;
    if (!fs::exists(src)) continue;
    std::error_code ec;
    fs::copy_file(src, fs::path(to) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error(ErrorCode::io, src.string() + ": cannot copy to " + to + " (" + ec.message() + ")");
  }
  return {};
}

Status run_export(const ExportOpts& o) {
  TROUPE_ASSIGN_OR_RETURN(auto ref, serve::adapter_base_ref(o.ckpt, o.base));
  TROUPE_ASSIGN_OR_RETURN(auto adapter, io::read_peft_adapter(o.ckpt));  // file checks before the (large) base
  TROUPE_ASSIGN_OR_RETURN(std::string dir, serve::adapter_base_dir(ref.path, o.ckpt, !o.base.empty()));
  TROUPE_ASSIGN_OR_RETURN(auto hf_config, read_json_file((fs::path(dir) / "config.json").string()));
  TROUPE_ASSIGN_OR_RETURN(auto base, io::load_model_dir(dir));
  TROUPE_ASSIGN_OR_RETURN(auto model, io::model_from_dir(base, {}));
  base.tensors.clear();  // the model holds the weights now
  const std::string fingerprint = io::base_fingerprint(hf_config, model.tensors());
  TROUPE_TRY(serve::check_base_fingerprint(ref, fingerprint, o.ckpt));
  TROUPE_TRY(io::check_adapter_base(adapter, model.tensors()));
  TROUPE_TRY(require_empty_out(o.out));
  if (!o.merge) {
    std::vector<policy::TensorSpec> specs;
    std::vector<float> values;
    flatten(adapter.tensors, specs, values);
    TROUPE_TRY(io::write_peft_adapter(o.out, adapter.config, specs, values));
    const std::string abs = fs::absolute(ref.path).lexically_normal().string();
    return io::write_adapter_base_ref((fs::path(o.out) / io::kAdapterBaseFile).string(),
                                      {abs, fingerprint, ref.base_dtype});
  }
  TROUPE_TRY(io::merge_lora(model.params(), model.tensors(), adapter));
  TROUPE_TRY(io::save_model(o.out, model, nullptr, io::ExpertLayout::per_expert, base.bos_token_id, base.eos_token_id,
                            base.pad_token_id));
  return copy_tokenizer_files(dir, o.out);
}

}  // namespace

Command add_export_command(CLI::App& root) {
  auto o = std::make_shared<ExportOpts>();
  auto* app = root.add_subcommand(
      "export",
      "Export a LoRA checkpoint (or a PEFT adapter directory) in PEFT layout, or merged into its base with --merge");
  app->add_option("ckpt", o->ckpt,
                  "LoRA checkpoint directory: adapter_config.json + adapter_model.safetensors (PEFT layout) + base.json "
                  "{\"path\", \"fingerprint\"}; any PEFT adapter directory with --base")
      ->required();
  app->add_option("out_dir", o->out, "Directory to write (created; must be empty)")->required();
  app->add_flag("--merge", o->merge,
                "Write the base with W + s*B*A merged into every adapted module: a Hugging Face model directory "
                "(config.json, model.safetensors in fp32, the base's tokenizer and chat template files) that transformers "
                "loads. Without --merge: the adapter in PEFT layout (PeftModel.from_pretrained loads it) plus base.json");
  app->add_option("--base", o->base,
                  "Base model (Hugging Face directory or .gguf) instead of base.json's path; base.json's fingerprint, "
                  "when there is one, is still checked");
  return {app, [o]() {
            auto st = run_export(*o);
            if (!st.ok()) return report_error(st.error());
            std::printf("exported %s -> %s%s\n", o->ckpt.c_str(), o->out.c_str(), o->merge ? " (merged)" : "");
            return 0;
          }};
}

}  // namespace troupe::launch
