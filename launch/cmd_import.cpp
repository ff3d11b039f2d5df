// `troupe import MODEL.gguf OUT_DIR [--dtype f32|bf16]`: a GGUF file (llama.cpp format) to a Hugging
// Face model directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
// generation_config.json) through policy::io::import_gguf_to_dir; bad input is exit 2 naming the file.
#include <cstdio>
#include <memory>

#include "troupe/launch/commands.h"
#include "troupe/policy/io/gguf_import.h"

namespace troupe::launch {

Command add_import_command(CLI::App& root) {
  struct Opts {
    std::string gguf, out, dtype = "f32";
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("import", "Convert a GGUF model file to a Hugging Face model directory");
  app->add_option("gguf", o->gguf, "GGUF file (architectures llama, qwen2, qwen3; a gpt2 byte-level BPE or llama SentencePiece vocabulary; tensors F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)")->required();
  app->add_option("out_dir", o->out, "Directory to write (created)")->required();
  app->add_option("--dtype", o->dtype, "Weight dtype of model.safetensors")->check(CLI::IsMember({"f32", "bf16"}));
  return {app, [o]() {
            const auto dtype = o->dtype == "bf16" ? policy::io::DType::bf16 : policy::io::DType::f32;
            auto st = policy::io::import_gguf_to_dir(o->gguf, o->out, dtype);
            if (!st.ok()) return report_error(st.error());
            std::printf("imported %s -> %s\n", o->gguf.c_str(), o->out.c_str());
            return 0;
          }};
}

}  // namespace troupe::launch
