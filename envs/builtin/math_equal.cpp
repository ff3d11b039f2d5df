// The `math` verifier (math_equal.h): normalise both answers, read each as a set, a tuple or one
// scalar expression, and compare. Deterministic and never evaluates anything but its own grammar;
// envs/python/troupe_env/answers.py is the same algorithm step for step (identical verdicts).
#include "troupe/envs/math_equal.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "troupe/envs/answer_extract.h"
#include "troupe/envs/tools.h"

namespace troupe::envs {

namespace {

__extension__ typedef __int128 i128;  // checked intermediates; GCC/Clang extension

constexpr i128 kLimit = INT64_MAX;  // an exact value's numerator and denominator stay within int64
constexpr int kPoints = 3;          // points an expression in letters is evaluated at
constexpr size_t kMaxLen = 1000;    // longer answers are compared as strings
constexpr int kMaxDepth = 64;
constexpr size_t kMaxSet = 64;      // larger sets are compared in order

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

// \text{X} (and its kin) -> " X ": the words stay, so unit stripping sees them as words.
void unwrap_text_commands(std::string& s) {
  for (const char* cmd : {"\\text", "\\textbf", "\\textrm", "\\mathrm", "\\mathbf", "\\mbox"}) {
    const std::string open = std::string(cmd) + "{";
    for (size_t at = s.find(open); at != std::string::npos; at = s.find(open, at)) {
      size_t i = at + open.size();
      int depth = 1;
      for (; i < s.size() && depth > 0; ++i) depth += s[i] == '{' ? 1 : (s[i] == '}' ? -1 : 0);
      if (depth != 0) return;
      s = s.substr(0, at) + " " + s.substr(at + open.size(), i - 1 - at - open.size()) + " " + s.substr(i);
    }
  }
}

// Trailing words of letters (units: "cm", "dollars", "square feet", "cm^2") after a number are dropped.
bool is_unit_word(const std::string& word) {
  size_t n = 0;
  while (n < word.size() && is_letter(word[n])) ++n;
  const std::string power = word.substr(n);
  return n > 0 && (power.empty() || power == "^2" || power == "^3" || power == "^{2}" || power == "^{3}");
}

void strip_unit_words(std::string& s) {
  std::string head = trim(s);
  bool dropped = false;
  for (;;) {
    size_t sp = head.find_last_of(" \t\n\r");
    if (sp == std::string::npos || !is_unit_word(head.substr(sp + 1))) break;
    head = trim(head.substr(0, sp));
    dropped = true;
  }
  char last = head.empty() ? '\0' : head.back();
  if (dropped && (is_digit(last) || last == '}' || last == ')' || last == '%' || last == '.')) s = head;
}

// "1,000,000" -> "1000000": a comma between a digit and exactly three digits.
std::string drop_thousands_commas(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    bool sep = s[i] == ',' && i > 0 && is_digit(s[i - 1]) && i + 3 < s.size() && is_digit(s[i + 1]) &&
               is_digit(s[i + 2]) && is_digit(s[i + 3]) && (i + 4 == s.size() || !is_digit(s[i + 4]));
    if (!sep) out += s[i];
  }
  return out;
}

// ---- exact-or-real numbers ----

struct Num {
  bool exact = true;
  int64_t num = 0, den = 1;  // when exact: lowest terms, den > 0
  double d = 0;              // always: the value as a double (num / den when exact)
  bool decimal = false;      // written with a decimal point somewhere
};

Num real(double d, bool decimal) {
  Num n;
  n.exact = false;
  n.d = d;
  n.decimal = decimal;
  return n;
}

Num rational(i128 p, i128 q, bool decimal) {
  if (q < 0) { p = -p; q = -q; }
  i128 a = p < 0 ? -p : p, b = q;
  while (b != 0) { i128 t = a % b; a = b; b = t; }
  if (a > 1) { p /= a; q /= a; }
  if (p > kLimit || p < -kLimit || q > kLimit) return real(static_cast<double>(p) / static_cast<double>(q), decimal);
  Num n;
  n.num = static_cast<int64_t>(p);
  n.den = static_cast<int64_t>(q);
  n.d = static_cast<double>(n.num) / static_cast<double>(n.den);
  n.decimal = decimal;
  return n;
}

std::optional<Num> combine(const Num& a, const Num& b, char op) {
  bool dec = a.decimal || b.decimal;
  if ((op == '/') && (b.exact ? b.num == 0 : b.d == 0)) return std::nullopt;
  if (a.exact && b.exact) {
    i128 an = a.num, ad = a.den, bn = b.num, bd = b.den;
    switch (op) {
      case '+': return rational(an * bd + bn * ad, ad * bd, dec);
      case '-': return rational(an * bd - bn * ad, ad * bd, dec);
      case '*': return rational(an * bn, ad * bd, dec);
      default: return rational(an * bd, ad * bn, dec);
    }
  }
  double r = op == '+' ? a.d + b.d : op == '-' ? a.d - b.d : op == '*' ? a.d * b.d : a.d / b.d;
  if (!std::isfinite(r)) return std::nullopt;
  return real(r, dec);
}

// floor(x * 10^6 + 1/2), exactly for an exact x.
i128 round6_exact(const Num& x) {
  i128 p = static_cast<i128>(x.num) * 2000000 + x.den, q = static_cast<i128>(x.den) * 2;
  i128 f = p / q;
  if ((p % q != 0) && (p < 0)) --f;
  return f;
}

std::optional<Num> power(const Num& base, const Num& e) {
  bool dec = base.decimal || e.decimal;
  if (base.exact && e.exact && e.den == 1 && e.num >= -64 && e.num <= 64) {
    if (base.num == 0 && e.num < 0) return std::nullopt;
    Num r = rational(1, 1, dec);
    Num b = e.num < 0 ? rational(base.den, base.num, dec) : base;
    for (int64_t k = 0; k < (e.num < 0 ? -e.num : e.num); ++k) {
      auto next = combine(r, b, '*');
      if (!next) return std::nullopt;
      r = *next;
    }
    return r;
  }
  double v = std::pow(base.d, e.d);
  if (!std::isfinite(v)) return std::nullopt;
  return real(v, dec);
}

// An integer r >= 0 with r^n == v, when there is one.
std::optional<int64_t> exact_root(int64_t v, int n) {
  if (v < 0) return std::nullopt;
  auto guess = static_cast<int64_t>(std::llround(std::pow(static_cast<double>(v), 1.0 / n)));
  for (int64_t r = guess > 0 ? guess - 1 : 0; r <= guess + 1; ++r) {
    i128 p = 1;
    for (int k = 0; k < n && p <= static_cast<i128>(v); ++k) p *= r;
    if (p == static_cast<i128>(v)) return r;
  }
  return std::nullopt;
}

std::optional<Num> root(const Num& x, const Num& index) {
  if (!index.exact || index.den != 1 || index.num < 2 || index.num > 64) return std::nullopt;
  int n = static_cast<int>(index.num);
  if (x.exact && x.num >= 0) {
    auto p = exact_root(x.num, n), q = exact_root(x.den, n);
    if (p && q) return rational(*p, *q, x.decimal || index.decimal);
  }
  if (x.d < 0 && n % 2 == 0) return std::nullopt;
  double v = x.d < 0 ? -std::pow(-x.d, 1.0 / n) : (n == 2 ? std::sqrt(x.d) : std::pow(x.d, 1.0 / n));
  return real(v, x.decimal || index.decimal);
}

// n! for an integer 0 <= n <= 20 (exact).
std::optional<Num> factorial(const Num& n) {
  if (!n.exact || n.den != 1 || n.num < 0 || n.num > 20) return std::nullopt;
  int64_t f = 1;
  for (int64_t k = 2; k <= n.num; ++k) f *= k;
  return rational(f, 1, n.decimal);
}

// n choose k for integers 0 <= k <= n (exact while it fits).
std::optional<Num> binomial(const Num& n, const Num& k) {
  if (!n.exact || !k.exact || n.den != 1 || k.den != 1 || k.num < 0 || n.num < k.num || n.num > 1000) return std::nullopt;
  Num r = rational(1, 1, false);
  for (int64_t i = 1; i <= k.num; ++i) {
    auto next = combine(r, rational(n.num - k.num + i, i, false), '*');
    if (!next) return std::nullopt;
    r = *next;
  }
  return r;
}

// The value a letter (or an unknown \command) takes at point k (0 while reading, 1..kPoints to compare): fixed, and
// the same in the Python SDK.
double variable_value(const std::string& name, int k) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return 0.5 + static_cast<double>((h >> 11) % 1000) / 997.0 + 0.713 * k;
}

// ---- one scalar expression ----
// expr := term (('+'|'-') term)*;  term := factor (('*'|'/') factor | factor)*  (juxtaposition
// multiplies);  factor := ('-'|'+') factor | atom ('^' factor)?;  atom := number | '(' expr ')' |
// '{' expr '}' | \frac A A | \sqrt[expr]? A | \pi | letter | \command;  A := '{' expr '}' | digit | letter.
class Scalar {
 public:
  Scalar(const std::string& s, int point) : s_(s), point_(point) {}

  std::optional<Num> parse() {
    auto v = expr(0);
    if (!v || i_ != s_.size()) return std::nullopt;
    return v;
  }
  const std::set<std::string>& variables() const { return vars_; }

 private:
  bool at(char c) const { return i_ < s_.size() && s_[i_] == c; }
  bool starts(const char* w) const { return s_.compare(i_, std::char_traits<char>::length(w), w) == 0; }

  std::optional<Num> expr(int depth) {
    if (depth > kMaxDepth) return std::nullopt;
    auto v = term(depth);
    while (v && (at('+') || at('-'))) {
      char op = s_[i_++];
      auto rhs = term(depth);
      if (!rhs) return std::nullopt;
      v = combine(*v, *rhs, op);
    }
    return v;
  }
  bool starts_atom() const {
    return i_ < s_.size() && (s_[i_] == '(' || s_[i_] == '{' || s_[i_] == '\\' || is_letter(s_[i_]));
  }
  std::optional<Num> term(int depth) {
    auto v = factor(depth + 1);
    while (v) {
      char op = 0;
      if (at('*') || at('/')) op = s_[i_++];
      else if (starts_atom()) op = '*';
      else break;
      auto rhs = factor(depth + 1);
      if (!rhs) return std::nullopt;
      v = combine(*v, *rhs, op);
    }
    return v;
  }
  std::optional<Num> factor(int depth) {
    if (depth > kMaxDepth) return std::nullopt;
    if (at('-') || at('+')) {
      bool neg = s_[i_++] == '-';
      auto v = factor(depth + 1);
      if (!v || !neg) return v;
      return combine(rational(0, 1, false), *v, '-');
    }
    auto base = atom(depth);
    while (base && at('!')) {
      ++i_;
      base = factorial(*base);
    }
    if (!base || !at('^')) return base;
    ++i_;
    auto e = at('{') ? group(depth) : factor(depth + 1);
    if (!e) return std::nullopt;
    return power(*base, *e);
  }
  std::optional<Num> group(int depth) {  // '{' expr '}', or one digit or letter (\frac12)
    if (at('{')) {
      ++i_;
      auto v = expr(depth + 1);
      if (!v || !at('}')) return std::nullopt;
      ++i_;
      return v;
    }
    if (i_ < s_.size() && is_digit(s_[i_])) return rational(s_[i_++] - '0', 1, false);
    if (i_ < s_.size() && is_letter(s_[i_])) return variable(std::string(1, s_[i_++]));
    return std::nullopt;
  }
  std::optional<Num> variable(const std::string& name) {
    vars_.insert(name);
    return real(variable_value(name, point_), false);
  }
  std::optional<Num> number() {
    size_t start = i_;
    i128 n = 0, d = 1;
    bool dot = false, big = false;
    for (; i_ < s_.size() && (is_digit(s_[i_]) || (s_[i_] == '.' && !dot)); ++i_) {
      if (s_[i_] == '.') { dot = true; continue; }
      if (n > kLimit || d > kLimit) { big = true; continue; }
      n = n * 10 + (s_[i_] - '0');
      if (dot) d *= 10;
    }
    std::string text = s_.substr(start, i_ - start);
    if (text == ".") return std::nullopt;
    if (big) return real(std::strtod(text.c_str(), nullptr), dot);
    return rational(n, d, dot);
  }
  std::optional<Num> command(int depth) {
    if (starts("\\binom")) {
      i_ += 6;
      auto n = group(depth), k = n ? group(depth) : std::nullopt;
      if (!k) return std::nullopt;
      return binomial(*n, *k);
    }
    if (starts("\\frac")) {
      i_ += 5;
      auto a = group(depth), b = a ? group(depth) : std::nullopt;
      if (!b) return std::nullopt;
      return combine(*a, *b, '/');
    }
    if (starts("\\sqrt")) {
      i_ += 5;
      Num index = rational(2, 1, false);
      if (at('[')) {
        ++i_;
        auto n = expr(depth + 1);
        if (!n || !at(']')) return std::nullopt;
        ++i_;
        index = *n;
      }
      auto x = group(depth);
      if (!x) return std::nullopt;
      return root(*x, index);
    }
    size_t start = i_++;
    while (i_ < s_.size() && is_letter(s_[i_])) ++i_;
    std::string name = s_.substr(start, i_ - start);
    if (name == "\\") return std::nullopt;
    if (name == "\\pi") return real(std::numbers::pi, false);
    return variable(name);
  }
  std::optional<Num> atom(int depth) {
    if (i_ >= s_.size()) return std::nullopt;
    char c = s_[i_];
    if (c == '(' || c == '{') {
      char close = c == '(' ? ')' : '}';
      ++i_;
      auto v = expr(depth + 1);
      if (!v || !at(close)) return std::nullopt;
      ++i_;
      return v;
    }
    if (is_digit(c) || c == '.') return number();
    if (c == '\\') return command(depth);
    if (is_letter(c)) return variable(std::string(1, s_[i_++]));
    return std::nullopt;
  }

  const std::string& s_;
  int point_;
  size_t i_ = 0;
  std::set<std::string> vars_;
};

bool near(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::fmax(1.0, std::fmax(std::fabs(a), std::fabs(b))); }

bool numbers_equal(const Num& a, const Num& b) {
  if (a.decimal || b.decimal) {
    if (a.exact && b.exact) return round6_exact(a) == round6_exact(b);
    if (std::fabs(a.d) < 1e9 && std::fabs(b.d) < 1e9) return std::floor(a.d * 1e6 + 0.5) == std::floor(b.d * 1e6 + 0.5);
    return near(a.d, b.d);
  }
  if (a.exact && b.exact) return a.num == b.num && a.den == b.den;
  return near(a.d, b.d);
}

// A scalar answer: its expression text (percent sign taken off) and whether it had one.
struct ScalarText {
  std::string text;
  bool percent = false;
};

ScalarText scalar_text(std::string s) {
  ScalarText t;
  if (!s.empty() && s.back() == '%') {
    s.pop_back();
    t.percent = true;
  }
  t.text = std::move(s);
  return t;
}

// nullopt when either side is not an expression of the grammar (then strings decide).
std::optional<bool> scalars_equal(const std::string& answer, const std::string& reference) {
  ScalarText a = scalar_text(answer), r = scalar_text(reference);
  Scalar pa(a.text, 0), pr(r.text, 0);
  auto va = pa.parse(), vr = pr.parse();
  if (!va || !vr) return std::nullopt;
  if (!pa.variables().empty() || !pr.variables().empty()) {
    if (pa.variables() != pr.variables() || a.percent || r.percent) return false;
    for (int k = 1; k <= kPoints; ++k) {
      auto x = Scalar(a.text, k).parse(), y = Scalar(r.text, k).parse();
      if (!x || !y || !near(x->d, y->d)) return false;
    }
    return true;
  }
  // A percentage equals its number and its number / 100 (50% == 50 == 0.5).
  std::vector<Num> as{*va}, rs{*vr};
  if (a.percent) as.push_back(*combine(*va, rational(100, 1, false), '/'));
  if (r.percent) rs.push_back(*combine(*vr, rational(100, 1, false), '/'));
  for (const auto& x : as)
    for (const auto& y : rs)
      if (numbers_equal(x, y)) return true;
  return false;
}

bool elements_equal(const std::string& a, const std::string& b) {
  if (a == b) return true;
  auto v = scalars_equal(a, b);
  return v.value_or(false);
}

// ---- structure: a set \{...\} or a bare list "a, b"; a tuple or interval (a, b] ----

enum class Shape { scalar, set, tuple };

struct Structured {
  Shape shape = Shape::scalar;
  char open = 0, close = 0;
  std::vector<std::string> items;
};

std::vector<std::string> split_top_level(const std::string& s) {
  std::vector<std::string> out{""};
  int depth = 0;
  for (char c : s) {
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    if (c == ',' && depth == 0) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

// Whether the bracket at 0 closes at the last character (any bracket kind closes any: intervals).
bool wraps_whole(const std::string& s) {
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(' || s[i] == '[' || s[i] == '{') ++depth;
    if (s[i] == ')' || s[i] == ']' || s[i] == '}') --depth;
    if (depth == 0) return i + 1 == s.size();
  }
  return false;
}

Structured structure_of(const std::string& s) {
  Structured out;
  if (s.size() >= 4 && s.starts_with("\\{") && s.ends_with("\\}") && wraps_whole(s.substr(1))) {
    out.shape = Shape::set;
    out.items = split_top_level(s.substr(2, s.size() - 4));
    return out;
  }
  if (s.size() >= 2 && (s[0] == '(' || s[0] == '[') && (s.back() == ')' || s.back() == ']') && wraps_whole(s)) {
    auto items = split_top_level(s.substr(1, s.size() - 2));
    if (items.size() > 1) {
      out.shape = Shape::tuple;
      out.open = s[0];
      out.close = s.back();
      out.items = std::move(items);
      return out;
    }
  }
  auto items = split_top_level(s);
  if (items.size() > 1) {
    out.shape = Shape::set;
    out.items = std::move(items);
  }
  return out;
}

bool ordered_equal(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!elements_equal(a[i], b[i])) return false;
  return true;
}

// Every element of a matched to a distinct equal element of b (greedy, in order); sets of more than
// kMaxSet elements are compared in order (bounded time).
bool unordered_equal(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  if (a.size() != b.size()) return false;
  if (a.size() > kMaxSet) return ordered_equal(a, b);
  std::vector<bool> used(b.size(), false);
  for (const auto& x : a) {
    bool found = false;
    for (size_t j = 0; j < b.size() && !found; ++j) {
      if (!used[j] && elements_equal(x, b[j])) used[j] = found = true;
    }
    if (!found) return false;
  }
  return true;
}

// "x=5" -> ("x", "5"); otherwise no name.
std::pair<std::string, std::string> split_assignment(const std::string& s) {
  if (s.size() >= 3 && is_letter(s[0]) && s[1] == '=' && s.find('=', 2) == std::string::npos) return {s.substr(0, 1), s.substr(2)};
  return {"", s};
}

}  // namespace

std::string math_normalize(const std::string& text) {
  std::string s = text;
  if (auto box = last_boxed(s)) s = *box;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\\left", ""}, {"\\right", ""}, {"\\!", ""}, {"\\,", " "}, {"\\;", " "}, {"\\:", " "}, {"\\ ", " "},
           {"~", " "}, {"\\displaystyle", ""}, {"\\dfrac", "\\frac"}, {"\\tfrac", "\\frac"}, {"\\dbinom", "\\binom"}, {"\\tbinom", "\\binom"}, {"\\%", "%"},
           {"\\$", ""}, {"$", ""}, {"^\\circ", ""}, {"^{\\circ}", ""}, {"\\circ", ""}, {"\xC2\xB0", ""},
           {"{,}", ","}, {"\\cdot", "*"}, {"\\times", "*"}, {"\\div", "/"}})
    replace_all(s, from, to);
  unwrap_text_commands(s);
  strip_unit_words(s);
  s = drop_thousands_commas(s);
  std::string out;
  for (char c : s)
    if (!is_space(c)) out += c;
  while (out.size() > 1 && out.back() == '.') out.pop_back();
  return out;
}

bool math_equal(const std::string& answer, const std::string& reference) {
  if (answer.size() > kMaxLen || reference.size() > kMaxLen) return trim(answer) == trim(reference);
  auto [a_name, a] = split_assignment(math_normalize(answer));
  auto [r_name, r] = split_assignment(math_normalize(reference));
  if (a.empty() || r.empty()) return false;
  if (!a_name.empty() && !r_name.empty() && a_name != r_name) return false;
  if (a == r) return true;
  Structured sa = structure_of(a), sr = structure_of(r);
  if (sa.shape == Shape::scalar && sr.shape == Shape::scalar) return scalars_equal(a, r).value_or(false);
  if (sa.shape == Shape::tuple && sr.shape == Shape::tuple)
    return sa.open == sr.open && sa.close == sr.close && ordered_equal(sa.items, sr.items);
  if (sa.shape == Shape::set && sr.shape == Shape::set) return unordered_equal(sa.items, sr.items);
  // A one-element set \{v\} against a scalar v.
  if (sa.shape == Shape::scalar && sr.shape == Shape::set) return unordered_equal({a}, sr.items);
  if (sr.shape == Shape::scalar && sa.shape == Shape::set) return unordered_equal(sa.items, {r});
  // A bare list "1, 2" against a tuple "(1, 2)": in order.
  bool bare_a = sa.shape == Shape::set && !a.starts_with("\\{"), bare_r = sr.shape == Shape::set && !r.starts_with("\\{");
  if ((bare_a && sr.shape == Shape::tuple) || (bare_r && sa.shape == Shape::tuple)) return ordered_equal(sa.items, sr.items);
  return false;
}

}  // namespace troupe::envs
