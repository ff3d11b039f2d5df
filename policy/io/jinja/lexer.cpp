// The chat-template lexer (lexer.h): pieces as jinja2's lexer cuts them (trim_blocks and
// lstrip_blocks on, `-` and `+` modifiers), then expression tokens of each tag.
// Invariant: string literals are skipped when looking for a tag's end, so "%}" inside one is text.
#include "lexer.h"

#include <algorithm>
#include <cctype>

namespace troupe::policy::io::jinja {

namespace {

// What a backslash escape in a template's string literal stands for.
constexpr Escape kLiteralEscapes[] = {{'\n', 'n'}, {'\t', 't'}, {'\r', 'r'}, {'\\', '\\'}, {'\'', '\''}, {'"', '"'}};

}  // namespace

std::vector<Piece> lex(const Source& src) {
  std::string_view s = src.text;
  std::vector<Piece> pieces;
  size_t pos = 0;
  bool strip_next = false, trim_next = false;
  auto add_text = [&](std::string t, size_t at) {
    if (strip_next) {
      size_t k = 0;
      while (k < t.size() && is_space(t[k])) ++k;
      t.erase(0, k);
    } else if (trim_next) {
      if (t.rfind("\r\n", 0) == 0) t.erase(0, 2);
      else if (!t.empty() && t[0] == '\n') t.erase(0, 1);
    }
    strip_next = trim_next = false;
    pieces.push_back({Piece::K::text, std::move(t), at});
  };
  while (pos <= s.size()) {
    size_t open = s.find('{', pos);
    while (open != std::string_view::npos && open + 1 < s.size() && s[open + 1] != '{' && s[open + 1] != '%' &&
           s[open + 1] != '#')
      open = s.find('{', open + 1);
    if (open == std::string_view::npos || open + 1 >= s.size()) {
      add_text(std::string(s.substr(pos)), pos);
      break;
    }
    char kind = s[open + 1];
    std::string text(s.substr(pos, open - pos));
    size_t body = open + 2;
    bool strip_left = body < s.size() && s[body] == '-';
    bool no_lstrip = body < s.size() && s[body] == '+';
    if (strip_left || no_lstrip) ++body;
    bool line_starting = pos == 0 || s[pos - 1] == '\n';
    if (strip_left) {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (kind != '{' && !no_lstrip) {
      size_t nl = text.rfind('\n');
      size_t from = nl == std::string::npos ? 0 : nl + 1;
      if ((nl != std::string::npos || line_starting) &&
          std::all_of(text.begin() + static_cast<long>(from), text.end(), [](char c) { return c == ' ' || c == '\t'; }))
        text.erase(from);
    }
    bool had_strip = strip_next;
    add_text(std::move(text), pos);
    (void)had_strip;
    // Find the closing delimiter; for {{ }} and {% %} skip string literals.
    char close = kind == '{' ? '}' : kind;
    size_t k = body;
    size_t end = std::string_view::npos;
    char quote = 0;
    for (; k + 1 < s.size(); ++k) {
      char c = s[k];
      if (kind != '#' && quote) {
        if (c == '\\') ++k;
        else if (c == quote) quote = 0;
        continue;
      }
      if (kind != '#' && (c == '\'' || c == '"')) { quote = c; continue; }
      if (c == close && s[k + 1] == '}') { end = k; break; }
    }
    if (end == std::string_view::npos)
      src.fail_at(open, std::string("unclosed tag '{") + kind + "' (no matching '" + close + "}')");
    size_t body_end = end;
    bool strip_right = body_end > body && s[body_end - 1] == '-';
    bool no_trim = body_end > body && s[body_end - 1] == '+';
    if (strip_right || no_trim) --body_end;
    if (kind == '{') pieces.push_back({Piece::K::expr, std::string(s.substr(body, body_end - body)), body});
    else if (kind == '%') pieces.push_back({Piece::K::stmt, std::string(s.substr(body, body_end - body)), body});
    strip_next = strip_right;
    trim_next = !strip_right && kind != '{' && !no_trim;
    pos = end + 2;
    if (pos == s.size()) break;
  }
  return pieces;
}

std::vector<Tok> tokenize(const Source& src, const std::string& body, size_t base) {
  std::vector<Tok> toks;
  size_t k = 0;
  static const char* ops3[] = {"//", "**", "==", "!=", "<=", ">="};
  while (k < body.size()) {
    char c = body[k];
    if (is_space(c)) { ++k; continue; }
    size_t at = base + k;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = k;
      while (e < body.size() && (std::isalnum(static_cast<unsigned char>(body[e])) || body[e] == '_')) ++e;
      toks.push_back({Tok::K::name, body.substr(k, e - k), 0, 0, at});
      k = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = k;
      while (e < body.size() && (std::isdigit(static_cast<unsigned char>(body[e])) || body[e] == '_')) ++e;
      bool is_float = e + 1 < body.size() && body[e] == '.' && std::isdigit(static_cast<unsigned char>(body[e + 1]));
      if (is_float) {
        ++e;
        while (e < body.size() && std::isdigit(static_cast<unsigned char>(body[e]))) ++e;
      }
      std::string lit = body.substr(k, e - k);
      lit.erase(std::remove(lit.begin(), lit.end(), '_'), lit.end());
      try {
        if (is_float) toks.push_back({Tok::K::number, lit, 0, std::stod(lit), at});
        else toks.push_back({Tok::K::integer, lit, std::stoll(lit), 0, at});
      } catch (const std::out_of_range&) {
        src.fail_at(at, "number literal out of range: " + lit.substr(0, 40));
      }
      k = e;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t e = k + 1;
      for (; e < body.size() && body[e] != c; ++e) {
        if (body[e] != '\\' || e + 1 >= body.size()) { v += body[e]; continue; }
        char n = body[++e];
        if (n == '\n') continue;  // a backslash-newline joins the lines
        if (const char r = unescape_code(kLiteralEscapes, n)) v += r;
        else v += '\\', v += n;
      }
      if (e >= body.size()) src.fail_at(at, "unterminated string literal");
      toks.push_back({Tok::K::str, v, 0, 0, at});
      k = e + 1;
    } else {
      std::string op(1, c);
      if (k + 1 < body.size()) {
        std::string two = body.substr(k, 2);
        for (const char* o : ops3)
          if (two == o) op = two;
      }
      if (std::string("+-*/%~=<>()[]{}.,:|!").find(c) == std::string::npos || op == "!")
        src.fail_at(at, std::string("unsupported character '") + c + "'");
      toks.push_back({Tok::K::op, op, 0, 0, at});
      k += op.size();
    }
  }
  toks.push_back({Tok::K::end, "", 0, 0, base + body.size()});
  return toks;
}

}  // namespace troupe::policy::io::jinja
