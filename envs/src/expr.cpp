// Exact rational arithmetic for verifiers: no eval, no floating point, every int64 operation
// checked (128-bit intermediates), recursion depth and input length capped.
#include "troupe/envs/expr.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <numeric>

namespace troupe::envs {

namespace {

__extension__ typedef __int128 i128;  // checked intermediates; GCC/Clang extension

constexpr size_t kMaxLen = 512;
constexpr int kMaxDepth = 64;

Result<Rational> normalize(i128 n, i128 d) {
  if (d == 0) return invalid_input("division by zero");
  if (d < 0) { n = -n; d = -d; }
  i128 a = n < 0 ? -n : n, b = d;
  while (b != 0) { i128 t = a % b; a = b; b = t; }
  if (a > 1) { n /= a; d /= a; }
  constexpr i128 lim = INT64_MAX;
  if (n > lim || n < -lim || d > lim) return invalid_input("number too large");
  return Rational{static_cast<int64_t>(n), static_cast<int64_t>(d)};
}

Result<Rational> add(Rational a, Rational b, int sign) {
  i128 n = static_cast<i128>(a.num) * b.den + sign * static_cast<i128>(b.num) * a.den;
  i128 d = static_cast<i128>(a.den) * b.den;
  return normalize(n, d);
}
Result<Rational> mul(Rational a, Rational b) {
  return normalize(static_cast<i128>(a.num) * b.num, static_cast<i128>(a.den) * b.den);
}
Result<Rational> divide(Rational a, Rational b) {
  if (b.num == 0) return invalid_input("division by zero");
  return normalize(static_cast<i128>(a.num) * b.den, static_cast<i128>(a.den) * b.num);
}

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  Result<ExprValue> parse() {
    ExprValue out;
    TROUPE_ASSIGN_OR_RETURN(out.value, expr(0));
    skip_space();
    if (i_ != s_.size()) return err("unexpected '" + std::string(1, s_[i_]) + "'");
    out.literals = std::move(literals_);
    return out;
  }

 private:
  Error err(const std::string& what) const {
    return invalid_input("expression column " + std::to_string(i_ + 1) + ": " + what);
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  // Operators, including the UTF-8 × (C3 97) and ÷ (C3 B7). Returns 0 if none.
  char peek_op() {
    skip_space();
    if (i_ >= s_.size()) return 0;
    char c = s_[i_];
    if (c == '+' || c == '-' || c == '*' || c == '/') return c;
    if (c == 'x' || c == 'X') return '*';
    if (static_cast<unsigned char>(c) == 0xC3 && i_ + 1 < s_.size()) {
      auto d = static_cast<unsigned char>(s_[i_ + 1]);
      if (d == 0x97) return '*';
      if (d == 0xB7) return '/';
    }
    return 0;
  }
  void take_op() { i_ += (static_cast<unsigned char>(s_[i_]) == 0xC3) ? 2 : 1; }

  Result<Rational> expr(int depth) {
    if (depth > kMaxDepth) return err("expression nested too deeply");
    TROUPE_ASSIGN_OR_RETURN(Rational acc, term(depth));
    for (char op = peek_op(); op == '+' || op == '-'; op = peek_op()) {
      take_op();
      TROUPE_ASSIGN_OR_RETURN(Rational rhs, term(depth));
      TROUPE_ASSIGN_OR_RETURN(acc, add(acc, rhs, op == '+' ? 1 : -1));
    }
    return acc;
  }
  Result<Rational> term(int depth) {
    TROUPE_ASSIGN_OR_RETURN(Rational acc, unary(depth));
    for (char op = peek_op(); op == '*' || op == '/'; op = peek_op()) {
      take_op();
      TROUPE_ASSIGN_OR_RETURN(Rational rhs, unary(depth));
      if (op == '*') {
        TROUPE_ASSIGN_OR_RETURN(acc, mul(acc, rhs));
      } else {
        TROUPE_ASSIGN_OR_RETURN(acc, divide(acc, rhs));
      }
    }
    return acc;
  }
  Result<Rational> unary(int depth) {
    if (depth > kMaxDepth) return err("expression nested too deeply");
    skip_space();
    if (i_ < s_.size() && s_[i_] == '-') {
      ++i_;
      TROUPE_ASSIGN_OR_RETURN(Rational v, unary(depth + 1));
      return Rational{-v.num, v.den};
    }
    return primary(depth);
  }
  Result<Rational> primary(int depth) {
    skip_space();
    if (i_ >= s_.size()) return err("expected a number or '('");
    if (s_[i_] == '(') {
      ++i_;
      TROUPE_ASSIGN_OR_RETURN(Rational v, expr(depth + 1));
      skip_space();
      if (i_ >= s_.size() || s_[i_] != ')') return err("expected ')'");
      ++i_;
      return v;
    }
    if (!std::isdigit(static_cast<unsigned char>(s_[i_]))) return err("expected a number or '('");
    i128 v = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      v = v * 10 + (s_[i_] - '0');
      if (v > INT64_MAX) return err("number too large");
      ++i_;
    }
    literals_.push_back(static_cast<int64_t>(v));
    return Rational{static_cast<int64_t>(v), 1};
  }

  const std::string& s_;
  size_t i_ = 0;
  std::vector<int64_t> literals_;
};

}  // namespace

std::string Rational::to_string() const {
  return den == 1 ? std::to_string(num) : std::to_string(num) + "/" + std::to_string(den);
}

Result<ExprValue> eval_expression(const std::string& text) {
  if (text.size() > kMaxLen) return invalid_input("expression longer than 512 bytes");
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return invalid_input("empty expression");
  return Parser(text).parse();
}

Result<Rational> parse_number(const std::string& raw) {
  std::string s;
  for (char c : raw) {
    if (c != ',' && c != ' ' && c != '$') s += c;  // "1,000", "$ 5"
  }
  if (s.empty() || s.size() > 40) return invalid_input("not a number: '" + raw + "'");
  bool neg = false;
  size_t i = 0;
  if (s[0] == '-' || s[0] == '+') { neg = s[0] == '-'; i = 1; }
  i128 num = 0, den = 1;
  bool digits = false, dot = false, slash = false;
  i128 slash_den = 0;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits = true;
      if (slash) {
        slash_den = slash_den * 10 + (c - '0');
      } else {
        num = num * 10 + (c - '0');
        if (dot) den *= 10;
      }
      if (num > INT64_MAX || den > INT64_MAX || slash_den > INT64_MAX) return invalid_input("number too large: '" + raw + "'");
    } else if (c == '.' && !dot && !slash) {
      dot = true;
    } else if (c == '/' && !slash && !dot && digits) {
      slash = true;
    } else {
      return invalid_input("not a number: '" + raw + "'");
    }
  }
  if (!digits || (slash && slash_den == 0)) return invalid_input("not a number: '" + raw + "'");
  if (slash) den = slash_den;
  return normalize(neg ? -num : num, den);
}

}  // namespace troupe::envs
