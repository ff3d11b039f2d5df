// The chat-template lexer (jinja/lexer.cpp): the source cut into text, {{ }} and {% %} pieces with
// jinja2's whitespace control, and a tag's body cut into expression tokens.
// Invariant: every piece and token keeps its byte offset in the source, so errors name line and column.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "value.h"

namespace troupe::policy::io::jinja {

struct Piece {
  enum class K { text, expr, stmt } k;
  std::string body;
  size_t offset;  // of the body in the source
};

struct Source {
  std::string_view text;
  std::vector<size_t> line_starts{0};
  explicit Source(std::string_view t) : text(t) {
    for (size_t k = 0; k < t.size(); ++k)
      if (t[k] == '\n') line_starts.push_back(k + 1);
  }
  std::pair<int, int> pos(size_t offset) const {
    auto it = std::upper_bound(line_starts.begin(), line_starts.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts.begin());
    return {static_cast<int>(line), static_cast<int>(offset - line_starts[line - 1] + 1)};
  }
  [[noreturn]] void fail_at(size_t offset, std::string message) const {
    auto [l, c] = pos(offset);
    fail(l, c, std::move(message));
  }
};

// Splits the source into text, {{ }} and {% %} pieces, dropping comments and applying `-`,
// trim_blocks (one newline after a block or comment tag is removed) and lstrip_blocks (spaces and
// tabs before a block or comment tag on its line are removed), as jinja2's lexer does.
std::vector<Piece> lex(const Source& src);

struct Tok {
  enum class K { name, str, integer, number, op, end } k;
  std::string s;
  int64_t i = 0;
  double d = 0;
  size_t offset = 0;
};

// The tokens of a tag body that starts at byte `base` of the source (an end token last).
std::vector<Tok> tokenize(const Source& src, const std::string& body, size_t base);

}  // namespace troupe::policy::io::jinja
