// Answer extraction (answer_extract.h): the answer part of a response or a reference text, by one
// of five rules. Pure functions of their input; a regex pattern is validated once, at config time.
#include "troupe/envs/answer_extract.h"

#include <cctype>

#include "troupe/envs/builtin.h"
#include "troupe/envs/tools.h"

namespace troupe::envs {

namespace {

std::optional<std::string> non_empty(std::string s) {
  s = trim(s);
  if (s.empty()) return std::nullopt;
  return s;
}

std::string drop_commas(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != ',') out += c;
  return out;
}

bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

// The last number: optional '-', digits with optional groups of ",ddd", an optional ".ddd" and an
// optional "/ddd". The '-' counts only when no letter or digit stands right before it ("5-3").
std::optional<std::string> last_number(const std::string& text) {
  static const std::regex number(R"(-?\d+(?:,\d{3}(?!\d))*(?:\.\d+)?(?:/\d+)?)");
  std::optional<std::string> found;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), number); it != std::sregex_iterator(); ++it) {
    std::string m = it->str();
    auto pos = static_cast<size_t>(it->position());
    if (m[0] == '-' && pos > 0 && is_alnum(text[pos - 1])) m.erase(0, 1);
    found = drop_commas(m);
  }
  return found;
}

std::optional<std::string> after_last_hashes(const std::string& text) {
  size_t at = text.rfind("####");
  if (at == std::string::npos) return std::nullopt;
  return non_empty(drop_commas(text.substr(at + 4)));
}

std::optional<std::string> last_group(const std::regex& re, const std::string& text) {
  std::optional<std::string> found;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    const auto& group = (*it)[1];
    found = group.matched ? std::optional<std::string>(group.str()) : std::nullopt;
  }
  if (!found) return std::nullopt;
  return non_empty(*found);
}

}  // namespace

std::optional<std::string> last_boxed(const std::string& text) {
  size_t best = std::string::npos, open = 0;
  for (const char* name : {"\\boxed", "\\fbox"}) {
    for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
      size_t brace = at + std::char_traits<char>::length(name);
      while (brace < text.size() && text[brace] == ' ') ++brace;
      if (brace < text.size() && text[brace] == '{' && (best == std::string::npos || at > best)) {
        best = at;
        open = brace;
      }
    }
  }
  if (best == std::string::npos) return std::nullopt;
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return text.substr(open + 1, i - open - 1);
  }
  return std::nullopt;  // unbalanced: the box never closes
}

Result<AnswerExtractor> make_answer_extractor(ExtractHow how, const std::string& pattern) {
  AnswerExtractor out;
  out.how = how;
  out.pattern = pattern;
  if (how != ExtractHow::regex) {
    if (!pattern.empty()) return invalid_input("'pattern' is only read with extract: regex");
    return out;
  }
  if (pattern.empty()) return invalid_input("extract: regex needs 'pattern' (a regex with one capture group)");
  try {
    out.re.emplace(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return invalid_input("'pattern' '" + pattern + "' is not a valid regex: " + e.what());
  }
  if (out.re->mark_count() == 0)
    return invalid_input("'pattern' '" + pattern + "' has no capture group: the answer is group 1, e.g. 'Answer: (.+)'");
  return out;
}

std::optional<std::string> extract_answer_with(const AnswerExtractor& extractor, const std::string& text) {
  switch (extractor.how) {
    case ExtractHow::answer_tag: return non_empty(extract_answer(text));
    case ExtractHow::last_number: return last_number(text);
    case ExtractHow::boxed: {
      auto box = last_boxed(text);
      return box ? non_empty(*box) : std::nullopt;
    }
    case ExtractHow::gsm8k: return after_last_hashes(text);
    case ExtractHow::regex: return extractor.re ? last_group(*extractor.re, text) : std::nullopt;
  }
  return std::nullopt;
}

Result<std::string> extract_reference_answer(const AnswerExtractor& extractor, const std::string& reference) {
  if (extractor.how == ExtractHow::answer_tag) return reference;  // as before extraction existed
  if (auto got = extract_answer_with(extractor, reference)) return *got;
  static constexpr const char* kWhat[] = {"", "no number", "no \\boxed{...}", "no '####' followed by an answer", ""};
  std::string what = extractor.how == ExtractHow::regex ? "no match of pattern '" + extractor.pattern + "' with a non-empty group 1"
                                                        : kWhat[static_cast<int>(extractor.how)];
  std::string shown = reference.size() > 80 ? reference.substr(0, 77) + "..." : reference;
  return invalid_input("reference '" + shown + "' has " + what + " (extract: " + enum_string(extractor.how) +
                       "; set extract_reference: false if the field is already the answer)");
}

std::string reference_completion_for(const AnswerExtractor& extractor, const std::string& raw, const std::string& answer) {
  if (extractor.how != ExtractHow::answer_tag && trim(raw) != answer) return raw;
  if (extractor.how == ExtractHow::gsm8k) return "#### " + answer;
  if (extractor.how == ExtractHow::boxed) return "\\boxed{" + answer + "}";
  return "<answer>" + answer + "</answer>";
}

}  // namespace troupe::envs
