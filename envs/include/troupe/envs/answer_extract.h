// Answer extraction for text verifiers: which part of a model's response (or of a dataset's
// reference text) is the answer. Pure functions; the Python SDK's troupe_env.answers.extract has
// the same rules (tests/envs/extract_cases.jsonl holds the cases both are tested on).
#pragma once

#include <optional>
#include <regex>
#include <string>
#include <utility>

#include "troupe/base/enum_names.h"
#include "troupe/base/result.h"

namespace troupe::envs {

// answer_tag: the last <answer>...</answer>, else the first line (extract_answer, the default);
// last_number: the last number (thousands commas dropped, a/b kept whole); boxed: the contents of the
// last \boxed{...} (or \fbox{...}), braces balanced; gsm8k: the text after the last "####", commas
// dropped; regex: group 1 of the last match of the pattern.
enum class ExtractHow { answer_tag, last_number, boxed, gsm8k, regex };

// How plus the compiled pattern (regex only). Build it with make_answer_extractor.
struct AnswerExtractor {
  ExtractHow how = ExtractHow::answer_tag;
  std::string pattern;         // the source text, for messages
  std::optional<std::regex> re;  // ECMAScript
};

// An error when `how` is regex and the pattern is empty, invalid or has no capture group, or when a
// pattern is given for another `how`.
Result<AnswerExtractor> make_answer_extractor(ExtractHow how, const std::string& pattern);

// The answer in `text`, trimmed; nullopt when there is none (no tag/number/box/####/match, or only
// whitespace). answer_tag always finds its first line, which may be empty (then nullopt).
std::optional<std::string> extract_answer_with(const AnswerExtractor& extractor, const std::string& text);

// A dataset row's reference text -> its answer: the extraction, or an error saying what was not
// found (the caller adds FILE:LINE). answer_tag leaves the reference as it is.
Result<std::string> extract_reference_answer(const AnswerExtractor& extractor, const std::string& reference);

// The SFT target of a row whose reference text is `raw` and answer `answer`: `raw` itself when the
// extraction took the answer out of it (its chain of thought ends in the answer), else a text the
// extractor reads `answer` from ("#### A", "\boxed{A}", "<answer>A</answer>").
std::string reference_completion_for(const AnswerExtractor& extractor, const std::string& raw, const std::string& answer);

// The last \boxed{...} / \fbox{...} contents with balanced braces (untrimmed), or nullopt.
std::optional<std::string> last_boxed(const std::string& text);

}  // namespace troupe::envs

namespace troupe {
template <>
struct EnumNames<envs::ExtractHow> {
  using E = envs::ExtractHow;
  static constexpr std::pair<std::string_view, E> table[] = {
      {"answer_tag", E::answer_tag}, {"last_number", E::last_number}, {"boxed", E::boxed},
      {"gsm8k", E::gsm8k},           {"regex", E::regex}};
};
}  // namespace troupe
