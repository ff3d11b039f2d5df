// Writes a troupe-made model directory for the CLI tests: a tiny random model of FAMILY (any supported one)
// with troupe's byte tokenizer, plus expected.json holding in-process log-probs of a text, so `troupe score
// DIR --text` can be checked on our own checkpoints.  Usage: make_checkpoint FAMILY OUT
#include <cmath>
#include <cstdio>
#include <fstream>

#include "troupe/policy/io/model_io.h"

using namespace troupe::policy;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FAMILY OUT_DIR\n", argv[0]);
    return 2;
  }
  ModelConfig c;
  const std::string family = argv[1];
  const auto known = troupe::enum_from_name<troupe::policy::ModelFamily>(family);
  if (!known) {
    std::fprintf(stderr, "make_checkpoint: unknown family '%s'\n", argv[1]);
    return 2;
  }
  c.family = *known;
  c.vocab_size = 3 + 256;
  c.hidden_size = 32, c.num_hidden_layers = 2, c.num_attention_heads = 4, c.num_key_value_heads = 2;
  c.head_dim = 8, c.intermediate_size = 24, c.num_experts = 4, c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16, c.tie_word_embeddings = family == "qwen3_moe" || family == "qwen3";
  if (family == "qwen3_moe" || family == "qwen2_moe") c.mlp_only_layers = {0};
  if (family == "llama" || family == "qwen2" || family == "qwen3") c.num_experts = 0;  // dense
  c.qkv_bias = family == "qwen2" || family == "qwen2_moe";
  if (family == "qwen2_moe") c.shared_expert_intermediate_size = 12;
  if (family == "llama") {
    c.rope_type = troupe::policy::RopeType::llama3, c.rope_factor = 8, c.rope_original_max_position_embeddings = 16;
    c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
  }
  auto model = Model::create(c, 7);
  if (model.ok()) {  // spread the weights (init std 0.02 is near uniform) and give the biases values
    for (const auto& t : model->tensors()) {
      float* p = model->params().data() + t.offset;
      const bool bias = t.name.ends_with(".bias");
      if (t.name.find("norm") != std::string::npos) continue;
      for (size_t i = 0; i < t.numel(); ++i)
        p[i] = bias ? 0.3f * std::sin(static_cast<float>(t.offset + i)) : 10 * p[i];
    }
  }
  auto tok = io::make_char_tokenizer({});
  if (!model.ok() || !tok.ok()) {
    std::fprintf(stderr, "make_checkpoint: %s\n", (!model.ok() ? model.error() : tok.error()).message.c_str());
    return 1;
  }
  const std::string text = "12+35=47";
  auto ids = (*tok)->encode(text);
  auto lp = io::score_tokens(*model, *ids);
  auto st = io::save_model(argv[2], *model, tok->get());
  if (!lp.ok() || !st.ok()) {
    std::fprintf(stderr, "make_checkpoint: %s\n", (!lp.ok() ? lp.error() : st.error()).message.c_str());
    return 1;
  }
  nlohmann::json e = {{"family", family},
                      {"cases", {{{"text", text}, {"tokens", *ids}, {"logprobs", *lp}}}}};
  std::ofstream(std::string(argv[2]) + "/expected.json") << e.dump(1) << "\n";
  return 0;
}
