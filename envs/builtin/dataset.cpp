// `dataset`: prompts and answers from the user's files (train and held-out; JSONL, parquet or a
// `datasets` directory: dataset_rows.h), a prompt template over each row's fields, scored by a chosen
// verifier; train rows drawn by seed, or once per epoch with shuffle (row_order.h). Rows are checked
// when the env is created: a malformed row, a missing field or a bad regex is an error naming FILE:LINE.
#include <regex>
#include <set>

#include "builtin/answer_scoring.h"
#include "builtin/dataset_rows.h"
#include "builtin/row_order.h"
#include "builtin/single_turn.h"
#include "src/config_util.h"
#include "troupe/base/build_config.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/expr.h"
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
using detail::load_rows;
using detail::RowOrder;
using detail::RowRules;
using detail::RowSource;

enum class Verifier { exact, numeric, regex, countdown };

using Row = DatasetRow;

class DatasetEnv final : public detail::SingleTurnEnv {
 public:
  std::vector<Row> train, eval;
  Verifier verifier = Verifier::exact;
  double format_reward = 0;
  bool shuffle = false;
  std::unique_ptr<RowOrder> order;  // with shuffle

  EnvInfo info() const override { return {"dataset", "1", false, 1, {}}; }

  Result<VerifyResult> verify(const json& metadata, const std::string& completion) override {
    if (verifier == Verifier::countdown)
      return detail::countdown_score_of(metadata, completion, true, format_reward > 0 ? format_reward : 0.1,
                                        "dataset");
    TROUPE_ASSIGN_OR_RETURN(const std::string reference, detail::reference_answer(metadata, "dataset"));
    const std::string given = extract_answer(completion);
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
      case Verifier::countdown: break;
    }
    return detail::answer_score(correct, extract_last_tag(completion, "answer").has_value(), format_reward);
  }

 protected:
  Result<Observation> make_instance(uint64_t seed, const ResetOptions& options) override {
    const auto& rows = options.split == Split::eval ? eval : train;
    if (rows.empty()) return invalid_input(std::string("dataset: the ") + split_name(options.split) + " split has no rows");
    // shuffle: the train split's n-th draw (options.extra["draw"], which the coordinator numbers
    // per env) takes the row RowOrder gives; otherwise, and for eval, row seed mod N.
    const auto draw = options.extra.find("draw");
    const bool ordered = shuffle && options.split == Split::train && draw != options.extra.end() &&
                         draw->is_number_unsigned();
    const Row& row = ordered ? rows[order->row_of(draw->get<uint64_t>(), rows.size())] : rows[seed % rows.size()];
    json meta = row.fields;
    meta["answer"] = row.answer;
    meta["reference_completion"] = row.reference_completion;
    meta["row"] = row.where;
    meta["split"] = split_name(options.split);
    if (ordered) meta["epoch"] = RowOrder::epoch_of(draw->get<uint64_t>(), rows.size());
    return detail::text_observation(row.prompt, std::move(meta));
  }
};

// What each row must hold for the verifier (dataset_rows.h).
RowRules rules_for(const std::string& tpl, const std::string& answer_field, Verifier verifier) {
  RowRules rules;
  rules.tpl = tpl;
  rules.answer_field = answer_field;
  rules.countdown = verifier == Verifier::countdown;
  rules.answer_regex = verifier == Verifier::regex;
  rules.answer_number = verifier == Verifier::numeric;
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
  TROUPE_ASSIGN_OR_RETURN(std::string base_dir, r.string("base_dir", ""));
  TROUPE_ASSIGN_OR_RETURN(env->format_reward, r.number("format_reward", 0.0, 0.0, 1.0));
  TROUPE_ASSIGN_OR_RETURN(const int eval_permille, r.eval_permille());
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
  else return invalid_input("env dataset: 'verifier' must be exact, numeric, regex or countdown (got '" + verifier + "')");
  if (train.empty())
    return invalid_input("env dataset: config needs 'train' (a JSONL or parquet file, or a datasets directory)");
  auto resolve = [&](const std::string& p) { return (base_dir.empty() || p.starts_with("/")) ? p : base_dir + "/" + p; };
  const RowRules rules = rules_for(tpl, answer_field, env->verifier);
  if (eval.empty() && !eval_src.split.empty()) return invalid_input("env dataset: 'eval_split' needs 'eval' (a file or directory)");
  train_src.path = resolve(train);
  eval_src.path = resolve(eval);
  TROUPE_ASSIGN_OR_RETURN(env->train, load_rows(train_src, rules));
  if (!eval.empty()) {
    TROUPE_ASSIGN_OR_RETURN(env->eval, load_rows(eval_src, rules));
    // Keep the splits disjoint even when the files overlap: a held-out prompt is never trained on.
    std::set<std::string> held_out;
    for (const auto& row : env->eval) held_out.insert(row.prompt);
    std::erase_if(env->train, [&](const Row& row) { return held_out.count(row.prompt) > 0; });
    if (env->train.empty()) return invalid_input("env dataset: every train row's prompt is also in the eval file");
  } else {
    // No held-out file: split the train file by a stable hash of each prompt.
    std::vector<Row> kept;
    for (auto& row : env->train) (in_eval_bucket(row.prompt, eval_permille) ? env->eval : kept).push_back(std::move(row));
    env->train = std::move(kept);
  }
  return std::unique_ptr<Env>(std::move(env));
}

}  // namespace troupe::envs
