// `dataset`: prompts and answers from the user's JSONL files (train and held-out), a prompt template
// over each row's fields, scored by a chosen verifier on the answer `extract` finds. Rows are checked
// when the env is created: a malformed row, a missing field, a bad regex or a reference without an
// answer (extract) is an error naming FILE:LINE.
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "builtin/answer_scoring.h"
#include "builtin/reward_hook.h"
#include "builtin/single_turn.h"
#include "src/config_util.h"
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

enum class Verifier { exact, numeric, regex, countdown, math, python };

struct Row {
  std::string prompt, answer, reference_completion;
  json fields;
  std::string where;  // FILE:LINE
};

// "{field}" -> the row's field (strings as is, other JSON dumped); "{{" and "}}" are literal braces.
Result<std::string> render_template(const std::string& tpl, const json& row, const std::string& where) {
  std::string out;
  for (size_t i = 0; i < tpl.size(); ++i) {
    char c = tpl[i];
    if (c == '{' && i + 1 < tpl.size() && tpl[i + 1] == '{') { out += '{'; ++i; continue; }
    if (c == '}' && i + 1 < tpl.size() && tpl[i + 1] == '}') { out += '}'; ++i; continue; }
    if (c != '{') { out += c; continue; }
    size_t end = tpl.find('}', i);
    if (end == std::string::npos) return invalid_input(where + ": template has an unclosed '{'");
    std::string key = tpl.substr(i + 1, end - i - 1);
    auto it = row.find(key);
    if (it == row.end()) return invalid_input(where + ": row has no field '" + key + "' used by the template");
    out += it->is_string() ? it->get<std::string>() : it->dump();
    i = end;
  }
  return out;
}

class DatasetEnv final : public detail::SingleTurnEnv {
 public:
  std::vector<Row> train, eval;
  Verifier verifier = Verifier::exact;
  AnswerExtractor extractor;  // which part of a response (and of a text reference) is the answer
  double format_reward = 0;
  std::string answer_field;                         // python: the row's raw reference
  std::shared_ptr<detail::RewardHook> hook;         // python: the user's function
  std::map<std::string, const Row*> rows_by_where;  // python: FILE:LINE -> its row

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
    auto it = rows_by_where.find(metadata.value("row", std::string()));
    if (it == rows_by_where.end())
      return invalid_input("dataset: verify needs the metadata's 'row' (FILE:LINE) of a loaded row (got " +
                           metadata.value("row", json()).dump() + ")");
    const Row& row = *it->second;
    return hook->score(row.prompt, completion, row.fields.value(answer_field, json()), row.fields);
  }
  void index_rows() {
    for (const auto* rows : {&train, &eval})
      for (const Row& row : *rows) rows_by_where[row.where] = &row;
  }

 protected:
  Result<Observation> make_instance(uint64_t seed, const ResetOptions& options) override {
    const auto& rows = options.split == Split::eval ? eval : train;
    if (rows.empty()) return invalid_input(std::string("dataset: the ") + split_name(options.split) + " split has no rows");
    const Row& row = rows[seed % rows.size()];
    json meta = row.fields;
    meta["answer"] = row.answer;
    meta["reference_completion"] = row.reference_completion;
    meta["row"] = row.where;
    meta["split"] = split_name(options.split);
    return detail::text_observation(row.prompt, std::move(meta));
  }
};

// `extractor` takes a text reference's answer out of it when `extract_reference`, and shapes the
// default SFT target.
Result<std::vector<Row>> load_rows(const std::string& path, const std::string& tpl, const std::string& answer_field,
                                   Verifier verifier, const AnswerExtractor& extractor, bool extract_reference) {
  std::ifstream in(path);
  if (!in) return invalid_input("env dataset: cannot open '" + path + "'");
  std::vector<Row> rows;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    const std::string where = path + ":" + std::to_string(lineno);
    if (trim(line).empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) return invalid_input(where + ": error: not valid JSON");
    if (!j.is_object()) return invalid_input(where + ": error: a row must be a JSON object");
    Row row;
    row.where = where;
    TROUPE_ASSIGN_OR_RETURN(row.prompt, render_template(tpl, j, where + ": error"));
    std::string raw;  // the reference text before extraction
    if (verifier == Verifier::countdown) {
      if (!j.contains("numbers") || !j["numbers"].is_array() || !j.contains("target") || !j["target"].is_number_integer())
        return invalid_input(where + ": error: countdown rows need 'numbers' (array of integers) and 'target' (integer)");
      for (const auto& x : j["numbers"]) {
        if (!x.is_number_integer()) return invalid_input(where + ": error: 'numbers' must hold integers");
      }
      row.answer = std::to_string(j["target"].get<int64_t>());
    } else {
      auto it = j.find(answer_field);
      if (it == j.end()) return invalid_input(where + ": error: row has no answer field '" + answer_field + "'");
      if (it->is_string()) {
        raw = it->get<std::string>();
        auto got = extract_reference ? extract_reference_answer(extractor, raw) : Result<std::string>(raw);
        if (!got.ok()) return invalid_input(where + ": error: " + got.error().message);
        row.answer = *got;
      } else if (it->is_number()) {
        row.answer = it->dump();
      } else {
        return invalid_input(where + ": error: answer field '" + answer_field + "' must be a string or a number");
      }
      if (verifier == Verifier::regex) {
        try {
          std::regex check(row.answer, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
          return invalid_input(where + ": error: answer is not a valid regex: " + e.what());
        }
      }
      if (verifier == Verifier::numeric && !parse_number(row.answer).ok())
        return invalid_input(where + ": error: answer '" + row.answer + "' is not a number (numeric verifier)");
    }
    if (auto c = j.find("completion"); c != j.end() && c->is_string()) {
      row.reference_completion = c->get<std::string>();
    } else {
      const bool plain = verifier == Verifier::countdown || raw.empty();
      row.reference_completion = reference_completion_for(verifier == Verifier::countdown ? AnswerExtractor{} : extractor,
                                                          plain ? row.answer : raw, row.answer);
    }
    row.fields = std::move(j);
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return invalid_input("env dataset: '" + path + "' has no rows");
  return rows;
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

  if (train.empty()) return invalid_input("env dataset: config needs 'train' (a JSONL file)");
  auto resolve = [&](const std::string& p) { return (base_dir.empty() || p.starts_with("/")) ? p : base_dir + "/" + p; };
  TROUPE_ASSIGN_OR_RETURN(env->train, load_rows(resolve(train), tpl, answer_field, env->verifier, env->extractor, extract_reference));
  if (!eval.empty()) {
    TROUPE_ASSIGN_OR_RETURN(env->eval, load_rows(resolve(eval), tpl, answer_field, env->verifier, env->extractor, extract_reference));
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
  if (env->verifier == Verifier::python) {
    hook.base_dir = base_dir;
    env->answer_field = answer_field;
    TROUPE_ASSIGN_OR_RETURN(env->hook, detail::RewardHook::open(hook));
    env->index_rows();
  }
  return std::unique_ptr<Env>(std::move(env));
}

}  // namespace troupe::envs
