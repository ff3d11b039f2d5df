// Reading the `dataset` env's files into checked rows (dataset_rows.h): each row's template
// rendered and its answer checked for the verifier, or an error naming FILE:LINE.
#include "builtin/dataset_rows.h"

#include <fstream>
#include <regex>

#include "troupe/envs/expr.h"
#include "troupe/envs/tools.h"

namespace troupe::envs::detail {

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

namespace {

Result<std::string> countdown_answer(const json& j, const std::string& where) {
  if (!j.contains("numbers") || !j["numbers"].is_array() || !j.contains("target") || !j["target"].is_number_integer())
    return invalid_input(where + ": error: countdown rows need 'numbers' (array of integers) and 'target' (integer)");
  for (const auto& x : j["numbers"]) {
    if (!x.is_number_integer()) return invalid_input(where + ": error: 'numbers' must hold integers");
  }
  return std::to_string(j["target"].get<int64_t>());
}

Result<std::string> field_answer(const json& j, const std::string& where, const RowRules& rules) {
  auto it = j.find(rules.answer_field);
  if (it == j.end()) return invalid_input(where + ": error: row has no answer field '" + rules.answer_field + "'");
  std::string answer;
  if (it->is_string()) {
    answer = it->get<std::string>();
  } else if (it->is_number()) {
    answer = it->dump();
  } else {
    return invalid_input(where + ": error: answer field '" + rules.answer_field + "' must be a string or a number");
  }
  if (rules.answer_regex) {
    try {
      std::regex check(answer, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return invalid_input(where + ": error: answer is not a valid regex: " + e.what());
    }
  }
  if (rules.answer_number && !parse_number(answer).ok())
    return invalid_input(where + ": error: answer '" + answer + "' is not a number (numeric verifier)");
  return answer;
}

}  // namespace

Result<DatasetRow> make_row(json j, const std::string& where, const RowRules& rules) {
  if (!j.is_object()) return invalid_input(where + ": error: a row must be a JSON object");
  DatasetRow row;
  row.where = where;
  TROUPE_ASSIGN_OR_RETURN(row.prompt, render_template(rules.tpl, j, where + ": error"));
  if (rules.countdown) {
    TROUPE_ASSIGN_OR_RETURN(row.answer, countdown_answer(j, where));
  } else {
    TROUPE_ASSIGN_OR_RETURN(row.answer, field_answer(j, where, rules));
  }
  if (auto c = j.find("completion"); c != j.end() && c->is_string()) {
    row.reference_completion = c->get<std::string>();
  } else {
    row.reference_completion = "<answer>" + row.answer + "</answer>";
  }
  row.fields = std::move(j);
  return row;
}

Result<std::vector<DatasetRow>> load_rows(const std::string& path, const RowRules& rules) {
  std::ifstream in(path);
  if (!in) return invalid_input("env dataset: cannot open '" + path + "'");
  std::vector<DatasetRow> rows;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    const std::string where = path + ":" + std::to_string(lineno);
    if (trim(line).empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) return invalid_input(where + ": error: not valid JSON");
    TROUPE_ASSIGN_OR_RETURN(DatasetRow row, make_row(std::move(j), where, rules));
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return invalid_input("env dataset: '" + path + "' has no rows");
  return rows;
}

}  // namespace troupe::envs::detail
