// The digit judge's weights (digit_judge.h), written as a model directory.
#include "digit_judge.h"

#include <vector>

#include "troupe/actors/roles.h"
#include "troupe/policy/io/model_io.h"

namespace troupe::test_fixtures {

namespace {
constexpr float kLogit = 50.0f;  // a head row's weight: one token's logit far above every other's

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The feature a token's embedding is the unit vector of: a digit's own (0..9), else 10.
int feature_of(const policy::io::Tokenizer& tok, int32_t id) {
  auto text = tok.decode({id});
  return text.ok() && text->size() == 1 && is_digit((*text)[0]) ? (*text)[0] - '0' : 10;
}
}  // namespace

Result<std::string> save_digit_judge(const std::string& dir) {
  actors::ExperimentConfig c;
  auto& m = c.policy.model;
  m.vocab_size = 100, m.hidden_size = 16, m.num_hidden_layers = 1, m.num_attention_heads = 2;
  m.num_key_value_heads = 1, m.head_dim = 8, m.intermediate_size = 16, m.num_experts = 0;
  m.family = policy::ModelFamily::llama, m.max_position_embeddings = 128;
  TROUPE_ASSIGN_OR_RETURN(auto b, actors::make_policy(c));
  auto& model = *b.model;
  const auto& tok = *b.tokenizer;
  std::vector<float> p(model.params().begin(), model.params().end());
  const auto* embed = model.find_tensor("model.embed_tokens.weight");
  const auto* head = model.find_tensor("lm_head.weight");
  const auto* o_proj = model.find_tensor("model.layers.0.self_attn.o_proj.weight");
  const auto* down = model.find_tensor("model.layers.0.mlp.down_proj.weight");
  if (!embed || !head || !o_proj || !down) return make_error(ErrorCode::internal, "digit judge: a tensor is missing");
  for (const auto* t : {embed, head, o_proj, down})
    for (size_t i = 0; i < t->numel(); ++i) p[t->offset + i] = 0.0f;
  const size_t C = static_cast<size_t>(m.hidden_size);
  for (int32_t id = 0; id < m.vocab_size; ++id)
    p[embed->offset + static_cast<size_t>(id) * C + static_cast<size_t>(feature_of(tok, id))] = 1.0f;
  for (char d = '0'; d <= '9'; ++d) {
    TROUPE_ASSIGN_OR_RETURN(auto ids, tok.encode(std::string(1, d)));
    p[head->offset + static_cast<size_t>(ids.at(0)) * C + static_cast<size_t>(d - '0')] = kLogit;
    if (d == '0') p[head->offset + static_cast<size_t>(ids.at(0)) * C + 10] = kLogit;
  }
  TROUPE_TRY(model.set_params(p));
  TROUPE_TRY(policy::io::save_model(dir, model, &tok, policy::io::ExpertLayout::per_expert, tok.bos_id(), tok.eos_id(),
                                    tok.pad_id()));
  return dir;
}

}  // namespace troupe::test_fixtures
