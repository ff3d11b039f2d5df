// RewardModelScorer (reward_model_scoring.h): a reward_model env's model in the env worker.
// Invariant: rendering is transformers' apply_chat_template(tokenize=False) of the two turns with no
// generation prompt, encoded without added BOS/EOS, as policy.reward_model_golden checks.
#include "reward_model_scoring.h"

#include <nlohmann/json.hpp>

#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/reward_model_dir.h"
#include "troupe/policy/reward_model.h"

namespace troupe::actors {

struct RewardModelScorer::State {
  policy::io::RewardModelDir rm;
  envs::ScoreTemplate how = envs::ScoreTemplate::chat;
  std::shared_ptr<const policy::io::ChatTemplate> tmpl;  // chat only
  policy::io::ChatRenderOptions options;
  std::string env;
};

RewardModelScorer::RewardModelScorer(std::unique_ptr<State> s) : s_(std::move(s)) {}
RewardModelScorer::~RewardModelScorer() = default;

Result<std::unique_ptr<RewardModelScorer>> RewardModelScorer::load(const envs::RewardModelSpec& spec,
                                                                   const std::string& env) {
  const std::string who = "env '" + env + "': reward model " + spec.path;
  auto rm = policy::io::load_reward_model(spec.path);
  if (!rm.ok()) return Error{rm.error().code, "env '" + env + "': " + rm.error().message};
  if (!rm->tokenizer) return invalid_input(who + ": the directory has no tokenizer (tokenizer.json)");
  auto s = std::make_unique<State>(State{std::move(rm).value(), spec.score_template, nullptr, {}, env});
  if (s->how == envs::ScoreTemplate::chat) {
    if (s->rm.chat_template.empty())
      return invalid_input(who + ": score_template chat needs a chat template (chat_template.jinja or "
                                 "tokenizer_config.json's chat_template); the directory has none (or use score_template: plain)");
    auto t = policy::io::ChatTemplate::parse(s->rm.chat_template, spec.path + " chat template");
    if (!t.ok()) return invalid_input("env '" + env + "': " + t.error().message);
    s->tmpl = std::make_shared<const policy::io::ChatTemplate>(std::move(t).value());
    s->options = policy::io::chat_options_for(s->rm.tokenizer.get(), s->rm.bos_token_id, s->rm.eos_token_id);
    s->options.add_generation_prompt = false;
  }
  return std::unique_ptr<RewardModelScorer>(new RewardModelScorer(std::move(s)));
}

Result<std::vector<double>> RewardModelScorer::score(const std::string& prompt, const std::vector<std::string>& responses) {
  std::vector<std::vector<int32_t>> seqs;
  seqs.reserve(responses.size());
  for (size_t j = 0; j < responses.size(); ++j) {
    std::string text;
    if (s_->how == envs::ScoreTemplate::plain) {
      text = prompt + responses[j];
    } else {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      messages.push_back({{"role", "user"}, {"content", prompt}});
      messages.push_back({{"role", "assistant"}, {"content", responses[j]}});
      auto r = policy::io::render_chat(*s_->tmpl, messages, s_->options);
      if (!r.ok()) return invalid_input("reward model: response " + std::to_string(j) + ": " + r.error().message);
      text = std::move(r).value();
    }
    auto ids = s_->rm.tokenizer->encode(text);
    if (!ids.ok()) return invalid_input("reward model: response " + std::to_string(j) + ": " + ids.error().message);
    if (ids->empty()) return invalid_input("reward model: response " + std::to_string(j) + " renders to no tokens");
    seqs.push_back(std::move(ids).value());
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto scores = policy::score_sequences(s_->rm.model, s_->rm.head, seqs);
  if (!scores.ok()) return invalid_input("reward model: " + scores.error().message);
  return std::vector<double>(scores->begin(), scores->end());
}

}  // namespace troupe::actors
