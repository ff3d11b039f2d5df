// `dataset`: prompts and answers from the user's files (train and held-out; JSONL, parquet or a
// `datasets` directory: dataset_rows.h), a prompt template over each row's fields, scored by a chosen
// verifier on the answer `extract` finds (or by the user's Python function); train rows drawn by seed,
// or once per epoch with shuffle (row_order.h), and/or by an LLM judge (judge.h; the reward is then the
// weighted sum of the named components). Rows are checked when the env is created: a malformed row, a
// missing field, a bad regex or a reference without an answer is an error naming FILE:LINE.
#include <cmath>
#include <map>
#include <regex>
#include <set>

#include "builtin/answer_scoring.h"
#include "builtin/dataset_cache.h"
#include "builtin/dataset_rows.h"
#include "builtin/judge.h"
#include "builtin/reward_hook.h"
#include "builtin/row_order.h"
#include "builtin/single_turn.h"
#include "src/config_util.h"
#include "troupe/base/build_config.h"
#include "troupe/envs/answer_extract.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/expr.h"
#include "troupe/envs/math_equal.h"
#include "troupe/envs/reward_model_spec.h"
#include "troupe/envs/tools.h"
#include "troupe/envs/trajectory.h"

namespace troupe::envs {

bool verify_exact(const std::string& answer, const std::string& reference) { return trim(answer) == trim(reference); }

bool verify_numeric(const std::string& answer, const std::string& reference) {
  auto a = parse_number(trim(answer));
  auto b = parse_number(trim(reference));
  return a.ok() && b.ok() && *a == *b;
}

namespace {

using detail::DatasetRow;
using detail::DatasetSplits;
using detail::load_rows;
using detail::RowOrder;
using detail::RowRules;
using detail::RowSource;

// A reward model's component (its raw score), given by the env worker that scores a reward_model env.
constexpr const char* kRewardModelComponent = "reward_model";

enum class Verifier { exact, numeric, regex, countdown, math, python, none };  // none: only the judge

using Row = DatasetRow;

class DatasetEnv final : public detail::SingleTurnEnv {
 public:
  std::shared_ptr<const DatasetSplits> rows;  // shared by every instance with the same config (dataset_cache)
  Verifier verifier = Verifier::exact;
  AnswerExtractor extractor;  // which part of a response (and of a text reference) is the answer
  double format_reward = 0;
  std::string answer_field;                         // python: the row's raw reference
  std::shared_ptr<detail::RewardHook> hook;         // python: the user's function
  bool shuffle = false;
  std::unique_ptr<RowOrder> order;  // with shuffle
  std::shared_ptr<const detail::Judge> judge;  // config.judge (null: none)
  std::map<std::string, double> weights;       // reward_weights (a component not named: weight 1)
  bool scored_externally = false;  // type: reward_model: the reward model scores; the prompt goes in the metadata
  // type: reward_model with reward_weights: the reward is the weighted sum of the components, the
  // reward model's (kRewardModelComponent) weighted score added by the env worker that scores it
  bool weighted_externally = false;

  EnvInfo info() const override { return {"dataset", "1", false, 1, {}}; }

  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    return judge || weighted_externally ? verify_weighted(metadata, completion) : verify_verifier(metadata, completion);
  }

  // With a judge (or weighted_externally): components `verifier` (a built-in verifier's reward; a
  // Python hook's own components, or `verifier` when it returns a number) and `judge` (with a judge),
  // the reward their weighted sum. A built-in verifier's `correct` is kept as a component outside the
  // sum (accuracy metrics read it).
  Result<VerifyResult> verify_weighted(const json& metadata, const std::string& completion) {
    TROUPE_ASSIGN_OR_RETURN(const Row* row, row_of(metadata));
    VerifyResult out;
    std::map<std::string, double> parts;
    if (verifier != Verifier::none) {
      TROUPE_ASSIGN_OR_RETURN(VerifyResult v, verify_verifier(metadata, completion));
      if (verifier == Verifier::python && !v.components.empty()) parts = v.components;
      else parts["verifier"] = v.reward;
      if (verifier != Verifier::python && v.components.count("correct")) out.components["correct"] = v.components["correct"];
    }
    detail::JudgeScore s;
    if (judge) {
      TROUPE_ASSIGN_OR_RETURN(s, judge->score(row->prompt, completion, row->answer));
      parts["judge"] = s.score;
    }
    for (const auto& [name, w] : weights)
      if (!parts.count(name) && !(scored_externally && name == kRewardModelComponent))
        return invalid_input(std::string(termination_name(Termination::reward_bad_return)) +
                             ": env dataset: reward_weights names '" + name + "', which the reward hook did not return");
    for (const auto& [name, x] : parts) {
      const auto w = weights.find(name);
      out.reward += (w == weights.end() ? 1.0 : w->second) * x;
      out.components[name] = x;
    }
    if (judge) out.info["judge_latency_s"] = s.latency_s;
    return out;
  }

  Result<VerifyResult> verify_verifier(const json& metadata, const std::string& completion) {
    if (verifier == Verifier::none) return VerifyResult{};  // scored externally (a reward model): reward 0 here
    if (verifier == Verifier::python) return verify_python(metadata, completion);
    if (verifier == Verifier::countdown)
      return detail::countdown_score_of(metadata, completion, true, format_reward > 0 ? format_reward : 0.1,
                                        "dataset");
    TROUPE_ASSIGN_OR_RETURN(const std::string reference, detail::reference_answer(metadata, "dataset"));
    const auto extracted = extract_answer_with(extractor, completion);
    const std::string given = extracted.value_or("");
    bool correct = false;
    switch (verifier) {
      case Verifier::exact: correct = verify_exact(given, reference); break;
      case Verifier::numeric: correct = verify_numeric(given, reference); break;
      case Verifier::regex: {
        try {
          correct = std::regex_match(given, std::regex(reference, std::regex::ECMAScript));
        } catch (const std::regex_error& e) {
          return invalid_input("dataset: bad regex '" + reference + "': " + e.what());
        }
        break;
      }
      case Verifier::math: correct = extracted.has_value() && math_equal(given, reference); break;
      case Verifier::countdown:
      case Verifier::python:
      case Verifier::none: break;
    }
    const bool well_formed = extractor.how == ExtractHow::answer_tag ? extract_last_tag(completion, "answer").has_value()
                                                                     : extracted.has_value();
    return detail::answer_score(correct, well_formed, format_reward);
  }

  // The hook gets the prompt, the raw reference (the row's answer field as written) and the whole row.
  Result<VerifyResult> verify_python(const json& metadata, const std::string& completion) {
    TROUPE_ASSIGN_OR_RETURN(const Row* row, row_of(metadata));
    return hook->score(row->prompt, completion, row->fields.value(answer_field, json()), row->fields);
  }

  Result<const Row*> row_of(const json& metadata) const {
    auto it = rows->by_where.find(metadata.value("row", std::string()));
    if (it == rows->by_where.end())
      return invalid_input("dataset: verify needs the metadata's 'row' (FILE:LINE) of a loaded row (got " +
                           metadata.value("row", json()).dump() + ")");
    return &*it->second;
  }

 protected:
  Result<Observation> make_instance(uint64_t seed, const ResetOptions& options) override {
    const auto& split = options.split == Split::eval ? rows->eval : rows->train;
    if (split.empty()) return invalid_input(std::string("dataset: the ") + split_name(options.split) + " split has no rows");
    // shuffle: the train split's n-th draw (options.extra["draw"], which the coordinator numbers
    // per env) takes the row RowOrder gives; otherwise, and for eval, row seed mod N.
    const auto draw = options.extra.find("draw");
    const bool ordered = shuffle && options.split == Split::train && draw != options.extra.end() &&
                         draw->is_number_unsigned();
    const Row& row = ordered ? split[order->row_of(draw->get<uint64_t>(), split.size())] : split[seed % split.size()];
    json meta = row.fields;
    meta["answer"] = row.answer;
    meta["reference_completion"] = row.reference_completion;
    meta["row"] = row.where;
    meta["split"] = split_name(options.split);
    if (ordered) meta["epoch"] = RowOrder::epoch_of(draw->get<uint64_t>(), split.size());
    if (scored_externally) meta["prompt"] = row.prompt;
    return detail::text_observation(row.prompt, std::move(meta));
  }
};

// What each row must hold for the verifier, and how its reference text gives the answer (dataset_rows.h).
RowRules rules_for(const std::string& tpl, const std::string& answer_field, Verifier verifier,
                   const AnswerExtractor& extractor, bool extract_reference) {
  RowRules rules;
  rules.tpl = tpl;
  rules.answer_field = answer_field;
  rules.countdown = verifier == Verifier::countdown;
  rules.answer_regex = verifier == Verifier::regex;
  rules.answer_number = verifier == Verifier::numeric;
  rules.extractor = extractor;
  rules.extract_reference = extract_reference;
  return rules;
}

// How one file is read: config `split_key` (its split, else the only one, else `prefer`),
// `max_rows` and `python` (what reads parquet files and datasets directories).
Result<RowSource> read_source(detail::ConfigReader& r, const std::string& split_key, const std::string& prefer) {
  RowSource src;
  TROUPE_ASSIGN_OR_RETURN(src.split, r.string(split_key, ""));
  src.prefer = src.split.empty() ? prefer : "";
  TROUPE_ASSIGN_OR_RETURN(src.max_rows, r.integer("max_rows", 0, 0, INT64_MAX));
  TROUPE_ASSIGN_OR_RETURN(src.python, r.string("python", troupe::python_executable()));
  return src;
}

// `judge` (judge.h) and `reward_weights` ({component: weight}, with a judge or scored externally;
// names checked where they are known: `judge`, and `verifier` for a built-in verifier; a Python
// hook's names are checked at each call).
Status read_judge(detail::ConfigReader& r, DatasetEnv& env) {
  const std::string where = r.where();
  const json* judge = r.raw("judge");
  const json* weights = r.raw("reward_weights");
  if (env.verifier == Verifier::none && !judge && !env.scored_externally)
    return invalid_input(where + ": verifier: none needs 'judge' (an env needs a reward source)");
  if (!judge && !(weights && env.scored_externally)) {
    if (weights)
      return invalid_input(where + ": 'reward_weights' needs 'judge' or a reward model (it weighs the verifier, the "
                                   "judge and the reward model)");
    return {};
  }
  if (judge) {
    TROUPE_ASSIGN_OR_RETURN(detail::JudgeConfig config, detail::read_judge_config(*judge, where));
    env.judge = std::make_shared<const detail::Judge>(std::move(config));
  }
  if (!weights) return {};
  if (!weights->is_object()) return invalid_input(where + ": 'reward_weights' must be a mapping {component: weight}");
  env.weighted_externally = env.scored_externally;
  std::string names = env.verifier == Verifier::none ? "" : "verifier";
  if (env.judge) names += names.empty() ? "judge" : ", judge";
  if (env.scored_externally) names += names.empty() ? "reward_model" : ", reward_model";
  for (auto it = weights->begin(); it != weights->end(); ++it) {
    if (!it->is_number() || !std::isfinite(it->get<double>()))
      return invalid_input(where + ": reward_weights." + it.key() + " must be a number");
    const bool known = (it.key() == "judge" && env.judge) || env.verifier == Verifier::python ||
                       (it.key() == "verifier" && env.verifier != Verifier::none) ||
                       (it.key() == kRewardModelComponent && env.scored_externally);
    if (!known)
      return invalid_input(where + ": reward_weights." + it.key() + " names no reward component (this env's are: " +
                           names + ")");
    env.weights[it.key()] = it->get<double>();
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<Env>> make_dataset_env(const json& config) {
  detail::ConfigReader r(config, "env dataset");
  TROUPE_TRY(r.check_object());
  auto env = std::make_unique<DatasetEnv>();
  TROUPE_ASSIGN_OR_RETURN(std::string train, r.string("train", ""));
  TROUPE_ASSIGN_OR_RETURN(std::string eval, r.string("eval", ""));
  TROUPE_ASSIGN_OR_RETURN(std::string tpl, r.string("template", "{question}"));
  TROUPE_ASSIGN_OR_RETURN(std::string answer_field, r.string("answer_field", "answer"));
  TROUPE_ASSIGN_OR_RETURN(std::string verifier, r.string("verifier", "exact"));
  TROUPE_ASSIGN_OR_RETURN(std::string extract, r.string("extract", "answer_tag"));
  TROUPE_ASSIGN_OR_RETURN(std::string pattern, r.string("pattern", ""));
  TROUPE_ASSIGN_OR_RETURN(const bool extract_reference, r.boolean("extract_reference", true));
  TROUPE_ASSIGN_OR_RETURN(std::string base_dir, r.string("base_dir", ""));
  TROUPE_ASSIGN_OR_RETURN(env->format_reward, r.number("format_reward", 0.0, 0.0, 1.0));
  TROUPE_ASSIGN_OR_RETURN(const int eval_permille, r.eval_permille());
  TROUPE_ASSIGN_OR_RETURN(detail::RewardHookConfig hook, detail::read_reward_hook_config(r));
  TROUPE_ASSIGN_OR_RETURN(RowSource train_src, read_source(r, "split", "train"));
  TROUPE_ASSIGN_OR_RETURN(RowSource eval_src, read_source(r, "eval_split", "test"));
  TROUPE_ASSIGN_OR_RETURN(env->shuffle, r.boolean("shuffle", false));
  TROUPE_ASSIGN_OR_RETURN(env->scored_externally, r.boolean(kScoredExternallyKey, false));
  TROUPE_ASSIGN_OR_RETURN(const int64_t order_seed, r.integer("seed", 0, INT64_MIN, INT64_MAX));
  env->order = std::make_unique<RowOrder>(static_cast<uint64_t>(order_seed));
  if (verifier == "exact") env->verifier = Verifier::exact;
  else if (verifier == "numeric") env->verifier = Verifier::numeric;
  else if (verifier == "regex") env->verifier = Verifier::regex;
  else if (verifier == "countdown") env->verifier = Verifier::countdown;
  else if (verifier == "math") env->verifier = Verifier::math;
  else if (verifier == "python") env->verifier = Verifier::python;
  else if (verifier == "none") env->verifier = Verifier::none;
  else return invalid_input("env dataset: 'verifier' must be exact, numeric, regex, countdown, math, python or none (got '" + verifier + "')");
  TROUPE_TRY(read_judge(r, *env));
  TROUPE_TRY(r.finish());
  auto how = enum_from_name<ExtractHow>(extract);
  if (!how)
    return invalid_input("env dataset: 'extract' must be answer_tag, last_number, boxed, gsm8k or regex (got '" + extract + "')");
  auto extractor = make_answer_extractor(*how, pattern);
  if (!extractor.ok()) return invalid_input("env dataset: " + extractor.error().message);
  env->extractor = std::move(*extractor);
  if ((env->verifier == Verifier::python) != !hook.reward.empty())
    return invalid_input(hook.reward.empty() ? "env dataset: verifier python needs 'reward' (MODULE:FUNCTION)"
                                             : "env dataset: 'reward' is for verifier: python (got '" + verifier + "')");
  if (train.empty())
    return invalid_input("env dataset: config needs 'train' (a JSONL or parquet file, or a datasets directory)");
  auto resolve = [&](const std::string& p) { return (base_dir.empty() || p.starts_with("/")) ? p : base_dir + "/" + p; };
  RowRules rules = rules_for(tpl, answer_field, env->verifier, env->extractor, extract_reference);
  rules.answer_optional = env->scored_externally && env->verifier == Verifier::none;
  if (eval.empty() && !eval_src.split.empty()) return invalid_input("env dataset: 'eval_split' needs 'eval' (a file or directory)");
  train_src.path = resolve(train);
  eval_src.path = resolve(eval);
  TROUPE_ASSIGN_OR_RETURN(env->rows, detail::shared_dataset_splits(config.dump(), [&]() -> Result<DatasetSplits> {
    DatasetSplits d;
    TROUPE_ASSIGN_OR_RETURN(d.train, load_rows(train_src, rules));
    if (!eval.empty()) {
      TROUPE_ASSIGN_OR_RETURN(d.eval, load_rows(eval_src, rules));
      // Keep the splits disjoint even when the files overlap: a held-out prompt is never trained on.
      std::set<std::string> held_out;
      for (const auto& row : d.eval) held_out.insert(row.prompt);
      std::erase_if(d.train, [&](const Row& row) { return held_out.count(row.prompt) > 0; });
      if (d.train.empty()) return invalid_input("env dataset: every train row's prompt is also in the eval file");
    } else {
      // No held-out file: split the train file by a stable hash of each prompt.
      std::vector<Row> kept;
      for (auto& row : d.train) (in_eval_bucket(row.prompt, eval_permille) ? d.eval : kept).push_back(std::move(row));
      d.train = std::move(kept);
    }
    return d;
  }));
  if (env->verifier == Verifier::python) {
    hook.base_dir = base_dir;
    env->answer_field = answer_field;
    TROUPE_ASSIGN_OR_RETURN(env->hook, detail::RewardHook::open(hook));
  }
  return std::unique_ptr<Env>(std::move(env));
}

}  // namespace troupe::envs
