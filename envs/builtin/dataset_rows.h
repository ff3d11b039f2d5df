// Private to the `dataset` env: a dataset file's rows read and checked into prompts and answers
// (the template over each row's fields, the answer field). Every error names FILE:LINE (or
// FILE:ROW for row-indexed formats); a loaded row always has its prompt, answer and completion.
#pragma once

#include <string>
#include <vector>

#include "troupe/envs/answer_extract.h"
#include "troupe/envs/env.h"

namespace troupe::envs::detail {

struct DatasetRow {
  std::string prompt, answer, reference_completion;
  json fields;
  std::string where;  // FILE:LINE
};

// What each row must hold beyond the template's fields: countdown rows carry `numbers` and
// `target` (the answer is the target); the others the answer field, whose text `extractor` takes
// the answer out of when `extract_reference` (a text without one is an error), and which must then
// be a valid regex (`answer_regex`) or a number (`answer_number`) when the verifier needs one. The
// default SFT target (no `completion` field) follows the extractor (reference_completion_for).
struct RowRules {
  std::string tpl = "{question}";
  std::string answer_field = "answer";
  bool countdown = false;
  bool answer_regex = false;
  bool answer_number = false;
  AnswerExtractor extractor;
  bool extract_reference = true;
  bool answer_optional = false;  // a row without the answer field has answer "" (reward_model envs without a verifier)
};

// "{field}" -> the row's field (strings as is, other JSON dumped); "{{" and "}}" are literal braces.
Result<std::string> render_template(const std::string& tpl, const json& row, const std::string& where);

// One row (a JSON value from `where`) checked and rendered.
Result<DatasetRow> make_row(json j, const std::string& where, const RowRules& rules);

// Where a split's rows come from: a JSONL file (any other name), a `.parquet` or `.arrow` file, or
// a directory (a `datasets` save_to_disk Dataset or DatasetDict, or a folder of .arrow/.parquet
// files); the last three are read by the SDK's troupe_env/read_rows.py run with `python`.
struct RowSource {
  std::string path;
  std::string split;      // a DatasetDict's split ("" : the only one, else `prefer`)
  std::string prefer;     // the split taken when there are several and `split` is empty
  int64_t max_rows = 0;   // read at most this many rows (0: all)
  std::string python;     // the interpreter that runs read_rows.py
};

// True when `path` is read by read_rows.py rather than as JSONL.
bool is_table_source(const std::string& path);

// Every row of the source, in its order; an error when it cannot be read, a row is bad or there
// is none. JSONL rows are named FILE:LINE, table rows FILE:ROW (ROW counts from 1; a DatasetDict
// split is named DIR[SPLIT]:ROW).
Result<std::vector<DatasetRow>> load_rows(const RowSource& source, const RowRules& rules);

}  // namespace troupe::envs::detail
