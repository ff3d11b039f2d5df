// `troupe checkpoint consolidate CKPT OUT_DIR`: a sharded learner's checkpoint (shards.json + one
// file per rank) written as one Hugging Face directory -- the model directory a checkpoint of one
// learner holds, or a LoRA run's adapter in PEFT layout with its base.json. Every shard is verified
// first (size and checksum, the error names the file and rank); bad input is exit 2.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "troupe/launch/commands.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/peft_adapter.h"
#include "troupe/policy/io/sharded_weights.h"

namespace troupe::launch {

namespace {

namespace fs = std::filesystem;
namespace io = policy::io;

// A checkpoint's files beside the weights that a model directory keeps (the tokenizer is written by
// save_model), copied as they are.
constexpr const char* kSideFiles[] = {"tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                                      "generation_config.json"};

struct ConsolidateOpts {
  std::string ckpt, out;
};

Status copy_if_there(const fs::path& from_dir, const fs::path& to_dir, const char* name) {
  const fs::path src = from_dir / name;
  std::error_code ec;
  if (!fs::exists(src, ec)) return {};
  fs::copy_file(src, to_dir / name, fs::copy_options::overwrite_existing, ec);
  if (ec) return make_error(ErrorCode::io, src.string() + ": cannot copy to " + to_dir.string() + " (" + ec.message() + ")");
  return {};
}

Status new_out_dir(const std::string& out) {
  std::error_code ec;
  if (fs::exists(out) && !fs::is_empty(out, ec))
    return invalid_input(out + ": exists and is not empty (consolidate writes a new directory)");
  fs::create_directories(out, ec);
  if (ec) return make_error(ErrorCode::io, out + ": cannot create directory (" + ec.message() + ")");
  return {};
}

Status consolidate(const ConsolidateOpts& o) {
  if (!io::has_shard_manifest(o.ckpt))
    return invalid_input(o.ckpt + ": no " + std::string(io::kShardManifestFile) +
                         " (not a sharded checkpoint; a checkpoint of one learner is already a model directory, and "
                         "`troupe export` writes a LoRA checkpoint's adapter)");
  if (fs::exists(fs::path(o.ckpt) / "state.json")) {  // a run's step directory: its other files too
    auto state = learner::verify_checkpoint(o.ckpt);
    if (!state.ok()) return state.error();
  }
  TROUPE_ASSIGN_OR_RETURN(auto m, io::read_shard_manifest(o.ckpt));
  TROUPE_TRY(io::verify_shard_files(o.ckpt, m));
  if (m.kind == "lora_adapter") {  // PEFT layout + base.json, as `troupe export` writes it
    TROUPE_ASSIGN_OR_RETURN(auto adapter, io::read_peft_adapter(o.ckpt));
    std::vector<policy::TensorSpec> specs;
    std::vector<float> values;
    for (const auto& [name, t] : adapter.tensors) {
      specs.push_back(policy::TensorSpec{name, t.shape, values.size()});
      values.insert(values.end(), t.data.begin(), t.data.end());
    }
    TROUPE_TRY(new_out_dir(o.out));
    TROUPE_TRY(io::write_peft_adapter(o.out, adapter.config, specs, values));
    return copy_if_there(o.ckpt, o.out, io::kAdapterBaseFile);
  }
  TROUPE_ASSIGN_OR_RETURN(auto loaded, io::load_model(o.ckpt));  // (the weights from the shards)
  TROUPE_TRY(new_out_dir(o.out));
  TROUPE_TRY(io::save_model(o.out, loaded.model, loaded.tokenizer.get(), io::ExpertLayout::per_expert,
                            loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id));
  for (const char* name : kSideFiles) TROUPE_TRY(copy_if_there(o.ckpt, o.out, name));
  return {};
}

}  // namespace

Command add_checkpoint_command(CLI::App& root) {
  auto o = std::make_shared<ConsolidateOpts>();
  auto* app = root.add_subcommand("checkpoint", "Work with checkpoints of sharded learners");
  app->require_subcommand(1);
  auto* sub = app->add_subcommand(
      "consolidate",
      "Write a sharded learner's checkpoint (shards.json + one file per rank) as one Hugging Face directory: "
      "config.json, model.safetensors and the tokenizer files; a LoRA run's: the adapter in PEFT layout and base.json");
  sub->add_option("ckpt", o->ckpt, "Checkpoint directory (checkpoints/step_N of a run with learner.shard)")->required();
  sub->add_option("out_dir", o->out, "Directory to write (created; must be empty)")->required();
  return {app, [o]() {
            auto st = consolidate(*o);
            if (!st.ok()) return report_error(st.error());
            std::printf("consolidated %s -> %s\n", o->ckpt.c_str(), o->out.c_str());
            return 0;
          }};
}

}  // namespace troupe::launch
