// `guess_number`: a multi-turn env with feedback. The env hides a number in [1, max_number]; each
// turn the model guesses and hears "higher" or "lower"; reward 1 - (turns-1)/max_turns when it
// finds the number, 0 if it runs out of turns. Secrets are split train/eval by the stable hash.
#include <regex>

#include "builtin/answer_scoring.h"
#include "src/config_util.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/tools.h"

namespace troupe::envs {

namespace {

std::optional<int64_t> last_integer(const std::string& text) {
  std::string s = extract_answer(text);
  static const std::regex kInt("-?\\d{1,12}");
  std::optional<int64_t> out;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), kInt); it != std::sregex_iterator(); ++it)
    out = std::stoll(it->str());
  return out;
}

class GuessNumberEnv final : public Env {
 public:
  int64_t max_number = 100;
  int max_turns = 8, eval_permille = 200;

  EnvInfo info() const override { return {"guess_number", "1", true, max_turns, {}}; }

  Result<Observation> reset(uint64_t seed, const ResetOptions& options) override {
    int64_t secret = 0;
    TROUPE_TRY(detail::draw_in_split(seed, options.split, eval_permille, "guess_number", [&](detail::SplitMix& rng) {
      secret = rng.uniform(1, max_number);
      return "guess:" + std::to_string(max_number) + ":" + std::to_string(secret);
    }));
    secret_ = secret;
    turns_ = 0;
    active_ = true;
    Observation o;
    o.text = "I am thinking of a whole number between 1 and " + std::to_string(max_number) +
             ". Guess it: reply with one number. After each guess I will say higher or lower. You have " +
             std::to_string(max_turns) + " guesses.";
    o.messages.push_back({"user", o.text});
    // The binary-search transcript a perfect policy would follow (for SFT on multi-turn data).
    json turns = json::array();
    for (int64_t lo = 1, hi = max_number; lo <= hi;) {
      int64_t mid = lo + (hi - lo) / 2;
      turns.push_back(std::to_string(mid));
      if (mid == secret) break;
      (mid < secret ? lo : hi) = mid < secret ? mid + 1 : mid - 1;
    }
    o.metadata = {{"answer", std::to_string(secret)}, {"reference_completion", turns[0]}, {"reference_turns", turns},
                  {"max_number", max_number}, {"split", split_name(options.split)}};
    return o;
  }

  Result<StepResult> step(const std::string& action) override {
    if (!active_) return invalid_input("guess_number: step() before reset() or after the episode ended");
    ++turns_;
    StepResult s;
    auto guess = last_integer(action);
    bool solved = guess && *guess == secret_;
    s.info["turn"] = turns_;
    if (solved) {
      s.done = true;
      s.reward = 1.0 - static_cast<double>(turns_ - 1) / max_turns;
      s.components["solved"] = 1;
      s.info["termination"] = "solved";
    } else if (turns_ >= max_turns) {
      s.done = true;
      s.components["solved"] = 0;
      s.info["termination"] = "max_turns";
      s.observation.text = "Out of guesses. The number was " + std::to_string(secret_) + ".";
    } else {
      s.observation.text = !guess ? "That is not a number. Reply with one whole number."
                                  : (*guess < secret_ ? "higher" : "lower");
    }
    if (!s.observation.text.empty()) s.observation.messages.push_back({"user", s.observation.text});
    if (s.done) active_ = false;
    return s;
  }

  // Single-call scoring: the completion is one guess; right first time scores 1.
  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    TROUPE_ASSIGN_OR_RETURN(std::string answer, detail::reference_answer(metadata, "guess_number"));
    VerifyResult v;
    auto guess = last_integer(completion);
    v.reward = (guess && std::to_string(*guess) == answer) ? 1.0 : 0.0;
    v.components["solved"] = v.reward;
    return v;
  }

  void release() override { active_ = false; }

 private:
  int64_t secret_ = 0;
  int turns_ = 0;
  bool active_ = false;
};

}  // namespace

Result<std::unique_ptr<Env>> make_guess_number_env(const json& config) {
  detail::ConfigReader r(config, "env guess_number");
  TROUPE_TRY(r.check_object());
  auto env = std::make_unique<GuessNumberEnv>();
  TROUPE_ASSIGN_OR_RETURN(env->max_number, r.integer("max_number", 100, 2, 1000000000));
  TROUPE_ASSIGN_OR_RETURN(auto max_turns, r.integer("max_turns", 8, 1, 1000));
  TROUPE_ASSIGN_OR_RETURN(env->eval_permille, r.eval_permille());
  TROUPE_TRY(r.finish());
  env->max_turns = static_cast<int>(max_turns);
  return std::unique_ptr<Env>(std::move(env));
}

}  // namespace troupe::envs
