// RewardModelScorer (reward_model_scoring.h): a reward_model env's model in the env worker.
// Invariant: rendering is transformers' apply_chat_template(tokenize=False) of the two turns with no
// generation prompt, encoded without added BOS/EOS, as policy.reward_model_golden checks.
#include "reward_model_scoring.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "troupe/actors/scorer.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/reward_model_dir.h"
#include "troupe/policy/reward_model.h"

namespace troupe::actors {

struct RewardModelScorer::State {
  std::optional<policy::io::RewardModelDir> rm;  // loaded here: no scorers
  std::optional<ScorerPeers> peers;              // else: the scorers serving it
  std::unique_ptr<policy::io::Tokenizer> tokenizer;
  std::string chat_template, path;
  int32_t bos = -1, eos = -1;
  envs::ScoreTemplate how = envs::ScoreTemplate::chat;
  std::shared_ptr<const policy::io::ChatTemplate> tmpl;  // chat only
  policy::io::ChatRenderOptions options;
  std::string env;
  double timeout_s = 30;
  std::atomic<size_t> next_scorer{0};  // each request starts at the next scorer in turn
};

namespace {

// A reward model's tokenizer, chat template and bos/eos ids without its weights (the scorers hold them).
Status read_text_side(RewardModelScorer::State& s) {
  namespace fs = std::filesystem;
  const std::string cfg = (fs::path(s.path) / "config.json").string();
  std::ifstream in(cfg);
  if (!in) return invalid_input(cfg + ": missing config.json in reward model directory " + s.path);
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_input(cfg + ": not a JSON object");
  auto id = [&](const char* k) { return j.contains(k) && j[k].is_number_integer() ? j[k].get<int32_t>() : -1; };
  s.bos = id("bos_token_id");
  s.eos = id("eos_token_id");
  if (fs::exists(fs::path(s.path) / policy::io::kHfTokenizerFile) || fs::exists(fs::path(s.path) / policy::io::kTroupeTokenizerFile)) {
    TROUPE_ASSIGN_OR_RETURN(s.tokenizer, policy::io::load_tokenizer_dir(s.path));
  }
  TROUPE_ASSIGN_OR_RETURN(s.chat_template, policy::io::read_chat_template_dir(s.path));
  if (s.tokenizer) {
    if (s.bos < 0) s.bos = s.tokenizer->bos_id();
    if (s.eos < 0) s.eos = s.tokenizer->eos_id();
  }
  return {};
}

}  // namespace

RewardModelScorer::RewardModelScorer(std::unique_ptr<State> s) : s_(std::move(s)) {}
RewardModelScorer::~RewardModelScorer() = default;
bool RewardModelScorer::on_scorers() const { return s_->peers.has_value(); }

Result<std::unique_ptr<RewardModelScorer>> RewardModelScorer::load(const envs::RewardModelSpec& spec,
                                                                   const std::string& env, double timeout_s) {
  const std::string who = "env '" + env + "': reward model " + spec.path;
  auto s = std::make_unique<State>();
  s->path = spec.path;
  s->how = spec.score_template;
  s->env = env;
  s->timeout_s = timeout_s;
  s->peers = scorer_peers();
  if (s->peers) {
    if (Status st = read_text_side(*s); !st.ok()) return Error{st.error().code, "env '" + env + "': " + st.error().message};
  } else {
    policy::ExecutionOptions exec;  // as the scorers run it: fp32, batch-invariant
    exec.batch_invariant = true;
    auto rm = policy::io::load_reward_model(spec.path, exec);
    if (!rm.ok()) return Error{rm.error().code, "env '" + env + "': " + rm.error().message};
    s->rm.emplace(std::move(rm).value());
    s->tokenizer = std::move(s->rm->tokenizer);
    s->chat_template = s->rm->chat_template;
    s->bos = s->rm->bos_token_id;
    s->eos = s->rm->eos_token_id;
  }
  if (!s->tokenizer) return invalid_input(who + ": the directory has no tokenizer (tokenizer.json)");
  if (s->how == envs::ScoreTemplate::chat) {
    if (s->chat_template.empty())
      return invalid_input(who + ": score_template chat needs a chat template (chat_template.jinja or "
                                 "tokenizer_config.json's chat_template); the directory has none (or use score_template: plain)");
    auto t = policy::io::ChatTemplate::parse(s->chat_template, spec.path + " chat template");
    if (!t.ok()) return invalid_input("env '" + env + "': " + t.error().message);
    s->tmpl = std::make_shared<const policy::io::ChatTemplate>(std::move(t).value());
    s->options = policy::io::chat_options_for(s->tokenizer.get(), s->bos, s->eos);
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
    auto ids = s_->tokenizer->encode(text);
    if (!ids.ok()) return invalid_input("reward model: response " + std::to_string(j) + ": " + ids.error().message);
    if (ids->empty()) return invalid_input("reward model: response " + std::to_string(j) + " renders to no tokens");
    seqs.push_back(std::move(ids).value());
  }
  if (s_->peers) {
    ScorerClient client(*s_->peers->system, s_->peers->scorers, s_->timeout_s,
                        static_cast<int>(s_->peers->scorers.size()) - 1);
    ScoreReq req;
    req.kind = static_cast<int32_t>(ScoreKind::sequence_score);
    req.model = s_->path;
    req.sequences = std::move(seqs);
    auto rep = client.call(req, s_->next_scorer++ % s_->peers->scorers.size());
    if (!rep.ok()) return Error{rep.error().code, "reward model: " + rep.error().message};
    if (rep->scores.size() != responses.size())
      return make_error(ErrorCode::internal, "reward model: the scorer answered " + std::to_string(rep->scores.size()) +
                                                 " scores for " + std::to_string(responses.size()) + " responses");
    return std::vector<double>(rep->scores.begin(), rep->scores.end());
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto scores = policy::score_sequences(s_->rm->model, s_->rm->head, seqs);
  if (!scores.ok()) return invalid_input("reward model: " + scores.error().message);
  return std::vector<double>(scores->begin(), scores->end());
}

}  // namespace troupe::actors
