// Reading the `dataset` env's files into checked rows (dataset_rows.h): each row's template
// rendered and its answer checked for the verifier, or an error naming FILE:LINE.
#include "builtin/dataset_rows.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "src/child_process.h"
#include "troupe/base/build_config.h"
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

// The answer field's answer; `raw` is set to the reference text before extraction (a string field).
Result<std::string> field_answer(const json& j, const std::string& where, const RowRules& rules, std::string& raw) {
  auto it = j.find(rules.answer_field);
  if (it == j.end()) return invalid_input(where + ": error: row has no answer field '" + rules.answer_field + "'");
  std::string answer;
  if (it->is_string()) {
    raw = it->get<std::string>();
    auto got = rules.extract_reference ? extract_reference_answer(rules.extractor, raw) : Result<std::string>(raw);
    if (!got.ok()) return invalid_input(where + ": error: " + got.error().message);
    answer = *got;
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
  std::string raw;  // the reference text before extraction
  if (rules.countdown) {
    TROUPE_ASSIGN_OR_RETURN(row.answer, countdown_answer(j, where));
  } else if (!rules.answer_optional || j.contains(rules.answer_field)) {
    TROUPE_ASSIGN_OR_RETURN(row.answer, field_answer(j, where, rules, raw));
  }
  if (auto c = j.find("completion"); c != j.end() && c->is_string()) {
    row.reference_completion = c->get<std::string>();
  } else {
    const bool plain = rules.countdown || raw.empty();
    row.reference_completion =
        reference_completion_for(rules.countdown ? AnswerExtractor{} : rules.extractor, plain ? row.answer : raw, row.answer);
  }
  row.fields = std::move(j);
  return row;
}

namespace {

// The rows of a JSONL file, blank lines skipped, at most max_rows.
Result<std::vector<DatasetRow>> jsonl_rows(const RowSource& src, const RowRules& rules) {
  std::ifstream in(src.path);
  if (!in || std::filesystem::is_directory(src.path)) return invalid_input("env dataset: cannot open '" + src.path + "'");
  if (!src.split.empty())
    return invalid_input("env dataset: '" + src.path + "' is a JSONL file: 'split' applies to a datasets directory");
  std::vector<DatasetRow> rows;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (src.max_rows > 0 && static_cast<int64_t>(rows.size()) >= src.max_rows) break;
    const std::string where = src.path + ":" + std::to_string(lineno);
    if (trim(line).empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) return invalid_input(where + ": error: not valid JSON");
    TROUPE_ASSIGN_OR_RETURN(DatasetRow row, make_row(std::move(j), where, rules));
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return invalid_input("env dataset: '" + src.path + "' has no rows");
  return rows;
}

// A file in the temporary directory, removed with this object.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& stem) {
    std::string tpl = (std::filesystem::temp_directory_path() / (stem + "-XXXXXX")).string();
    const int fd = ::mkstemp(tpl.data());
    if (fd >= 0) {
      ::close(fd);
      path = tpl;
    }
  }
  ~TempFile() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove(path, ec);
  }
};

// read_rows.py run on the source, its rows written to `out` (first line: {"source": NAME}).
Status run_reader(const RowSource& src, const std::string& out) {
  ChildOptions opts;
  opts.argv = {src.python, std::string(TROUPE_SOURCE_DIR) + "/envs/python/troupe_env/read_rows.py", src.path,
               "--out", out, "--header"};
  if (!src.split.empty()) opts.argv.insert(opts.argv.end(), {"--split", src.split});
  if (!src.prefer.empty()) opts.argv.insert(opts.argv.end(), {"--prefer", src.prefer});
  if (src.max_rows > 0) opts.argv.insert(opts.argv.end(), {"--max-rows", std::to_string(src.max_rows)});
  TempFile log("troupe-rows-log");
  opts.log_path = log.path;
  opts.stdout_to_null = true;
  ChildProcess child;
  TROUPE_TRY(child.start(std::move(opts), "env dataset: reading '" + src.path + "'"));
  while (child.alive()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const int status = child.exit_status();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  std::string err;
  {
    std::ifstream in(log.path);
    std::string line;
    while (std::getline(in, line))
      if (!trim(line).empty()) err = trim(line);  // the reader's error is its last line
  }
  if (err.starts_with("error: ")) err = err.substr(7);
  if (err.empty()) err = "cannot read it";
  if (err.find(src.path) == std::string::npos) err = "'" + src.path + "': " + err;  // name the file
  return invalid_input("env dataset: " + err + " (read by " + src.python + ", which " + describe_wait_status(status) + ")");
}

// The rows of a parquet/arrow file or datasets directory, through read_rows.py.
Result<std::vector<DatasetRow>> table_rows(const RowSource& src, const RowRules& rules) {
  if (!std::filesystem::exists(src.path)) return invalid_input("env dataset: cannot open '" + src.path + "'");
  TempFile out("troupe-rows");
  if (out.path.empty()) return invalid_input("env dataset: cannot make a temporary file to read '" + src.path + "'");
  TROUPE_TRY(run_reader(src, out.path));
  std::ifstream in(out.path);
  std::string line, source = src.path;
  std::vector<DatasetRow> rows;
  for (int64_t n = 0; std::getline(in, line); ++n) {
    json j = json::parse(line, nullptr, false);
    if (n == 0) {
      if (j.is_object() && j.contains("source") && j["source"].is_string()) source = j["source"].get<std::string>();
      continue;
    }
    const std::string where = source + ":" + std::to_string(n);
    if (j.is_discarded()) return invalid_input(where + ": error: the row reader wrote no valid JSON");
    TROUPE_ASSIGN_OR_RETURN(DatasetRow row, make_row(std::move(j), where, rules));
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return invalid_input("env dataset: '" + source + "' has no rows");
  return rows;
}

}  // namespace

bool is_table_source(const std::string& path) {
  return path.ends_with(".parquet") || path.ends_with(".arrow") || std::filesystem::is_directory(path);
}

Result<std::vector<DatasetRow>> load_rows(const RowSource& source, const RowRules& rules) {
  return is_table_source(source.path) ? table_rows(source, rules) : jsonl_rows(source, rules);
}

}  // namespace troupe::envs::detail
