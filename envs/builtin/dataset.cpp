// `dataset`: prompts and answers from the user's files (train and held-out; JSONL, parquet or a
// `datasets` directory: dataset_rows.h), a prompt template over each row's fields, scored by a chosen
// verifier on the answer `extract` finds (or by the user's Python function); train rows drawn by seed,
// or once per epoch with shuffle (row_order.h). Rows are checked when the env is created: a malformed
// row, a missing field, a bad regex or a reference without an answer is an error naming FILE:LINE.
#include <map>
#include <regex>
#include <set>

#include "builtin/answer_scoring.h"
#include "builtin/dataset_cache.h"
#include "builtin/dataset_rows.h"
#include "builtin/reward_hook.h"
#include "builtin/row_order.h"
#include "builtin/single_turn.h"
#include "src/config_util.h"
#include "troupe/base/build_config.h"
#include "troupe/envs/answer_extract.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/expr.h"
#include "troupe/envs/math_equal.h"
#include "troupe/envs/tools.h"

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

enum class Verifier { exact, numeric, regex, countdown, math, python };

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

  EnvInfo info() const override { return {"dataset", "1", false, 1, {}}; }

  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
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
      case Verifier::python: break;
    }
    const bool well_formed = extractor.how == ExtractHow::answer_tag ? extract_last_tag(completion, "answer").has_value()
                                                                     : extracted.has_value();
    return detail::answer_score(correct, well_formed, format_reward);
  }

  // The hook gets the prompt, the raw reference (the row's answer field as written) and the whole row.
  Result<VerifyResult> verify_python(const json& metadata, const std::string& completion) {
    auto it = rows->by_where.find(metadata.value("row", std::string()));
    if (it == rows->by_where.end())
      return invalid_input("dataset: verify needs the metadata's 'row' (FILE:LINE) of a loaded row (got " +
                           metadata.value("row", json()).dump() + ")");
    const Row& row = *it->second;
    return hook->score(row.prompt, completion, row.fields.value(answer_field, json()), row.fields);
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
  TROUPE_ASSIGN_OR_RETURN(const int64_t order_seed, r.integer("seed", 0, INT64_MIN, INT64_MAX));
  env->order = std::make_unique<RowOrder>(static_cast<uint64_t>(order_seed));
  TROUPE_TRY(r.finish());
  if (verifier == "exact") env->verifier = Verifier::exact;
  else if (verifier == "numeric") env->verifier = Verifier::numeric;
  else if (verifier == "regex") env->verifier = Verifier::regex;
  else if (verifier == "countdown") env->verifier = Verifier::countdown;
  else if (verifier == "math") env->verifier = Verifier::math;
  else if (verifier == "python") env->verifier = Verifier::python;
  else return invalid_input("env dataset: 'verifier' must be exact, numeric, regex, countdown, math or python (got '" + verifier + "')");
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
  const RowRules rules = rules_for(tpl, answer_field, env->verifier, env->extractor, extract_reference);
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
