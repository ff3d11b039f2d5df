// The Jinja subset of Hugging Face chat templates: a lexer (tags, whitespace control, trim_blocks and
// lstrip_blocks as transformers sets them), a recursive-descent parser to a small AST and a tree
// evaluator over JSON-like values, with Python's semantics where templates rely on them (truthiness,
// str(), json.dumps, str methods). Inside this file errors are thrown as TemplateError (position +
// message) and turned into a troupe::Error at the two public entry points.
#include "troupe/policy/io/chat_template.h"

#include "troupe/policy/io/gguf_import.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

namespace troupe::policy::io {
namespace jinja {
namespace {

struct TemplateError {
  int line, col;
  std::string message;
};

[[noreturn]] void fail(int line, int col, std::string message) { throw TemplateError{line, col, std::move(message)}; }

// ---- values -------------------------------------------------------------------------------------

struct Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, like a Python dict
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(const Args&, const Kwargs&)>;

struct Value {
  enum class T { undefined, none, boolean, integer, number, string, array, object, function } t = T::undefined;
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::string s;
  std::shared_ptr<Array> a;
  std::shared_ptr<Object> o;  // a namespace() shares it, so attribute assignment is visible to all holders
  bool is_namespace = false;
  std::shared_ptr<Function> f;

  static Value none() { Value v; v.t = T::none; return v; }
  static Value boolean(bool x) { Value v; v.t = T::boolean; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.t = T::integer; v.i = x; return v; }
  static Value number(double x) { Value v; v.t = T::number; v.d = x; return v; }
  static Value string(std::string x) { Value v; v.t = T::string; v.s = std::move(x); return v; }
  static Value array(Array x = {}) { Value v; v.t = T::array; v.a = std::make_shared<Array>(std::move(x)); return v; }
  static Value object(Object x = {}) { Value v; v.t = T::object; v.o = std::make_shared<Object>(std::move(x)); return v; }
  static Value function(Function fn) { Value v; v.t = T::function; v.f = std::make_shared<Function>(std::move(fn)); return v; }

  bool defined() const { return t != T::undefined; }
  bool is_str() const { return t == T::string; }
  bool is_num() const { return t == T::integer || t == T::number; }
  double as_double() const { return t == T::integer ? static_cast<double>(i) : d; }
  const Value* find(const std::string& key) const {
    if (!o) return nullptr;
    for (auto& [k, v] : *o)
      if (k == key) return &v;
    return nullptr;
  }
  void put(const std::string& key, Value v) {
    for (auto& [k, old] : *o)
      if (k == key) { old = std::move(v); return; }
    o->emplace_back(key, std::move(v));
  }
};

using T = Value::T;

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      for (auto& e : j) a.push_back(from_json(e));
      return Value::array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (auto it = j.begin(); it != j.end(); ++it) o.emplace_back(it.key(), from_json(it.value()));
      return Value::object(std::move(o));
    }
    default: return Value::none();
  }
}

bool truthy(const Value& v) {
  switch (v.t) {
    case T::undefined:
    case T::none: return false;
    case T::boolean: return v.b;
    case T::integer: return v.i != 0;
    case T::number: return v.d != 0;
    case T::string: return !v.s.empty();
    case T::array: return !v.a->empty();
    case T::object: return v.is_namespace || !v.o->empty();
    case T::function: return true;
  }
  return false;
}

bool equal(const Value& x, const Value& y) {
  if (x.is_num() && y.is_num()) return x.as_double() == y.as_double();
  if (x.is_num() && y.t == T::boolean) return x.as_double() == (y.b ? 1 : 0);
  if (y.is_num() && x.t == T::boolean) return equal(y, x);
  if (x.t != y.t) return false;
  switch (x.t) {
    case T::undefined:
    case T::none: return true;
    case T::boolean: return x.b == y.b;
    case T::string: return x.s == y.s;
    case T::array:
      if (x.a->size() != y.a->size()) return false;
      for (size_t k = 0; k < x.a->size(); ++k)
        if (!equal((*x.a)[k], (*y.a)[k])) return false;
      return true;
    case T::object:
      if (x.o->size() != y.o->size()) return false;
      for (auto& [k, v] : *x.o) {
        const Value* w = y.find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    default: return x.f == y.f;
  }
}

// Python's repr(float): the shortest digits that read back to the same double.
std::string float_repr(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string json_string(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t k = 0; k < s.size(); ++k) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else if (c >= 0x80 && ensure_ascii) {
          uint32_t cp = 0;
          int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
          cp = c & (0x3F >> extra);
          for (int e = 0; e < extra && k + 1 < s.size(); ++e) cp = (cp << 6) | (static_cast<unsigned char>(s[++k]) & 0x3F);
          char buf[16];
          if (cp >= 0x10000) {
            cp -= 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", cp);
          }
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

struct JsonStyle {
  int indent = -1;  // -1: on one line
  std::string item_sep = ", ", key_sep = ": ";
  bool ensure_ascii = false, sort_keys = false;
};

// Python's json.dumps.
void dump_json(const Value& v, const JsonStyle& st, int depth, std::string& out) {
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(st.indent * d), ' ');
  };
  switch (v.t) {
    case T::undefined:
    case T::none: out += "null"; return;
    case T::boolean: out += v.b ? "true" : "false"; return;
    case T::integer: out += std::to_string(v.i); return;
    case T::number: out += float_repr(v.d); return;
    case T::string: out += json_string(v.s, st.ensure_ascii); return;
    case T::function: throw TemplateError{0, 0, "tojson: a function is not JSON"};
    case T::array: {
      if (v.a->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t k = 0; k < v.a->size(); ++k) {
        if (k) out += st.item_sep;
        if (st.indent >= 0) newline(depth + 1);
        dump_json((*v.a)[k], st, depth + 1, out);
      }
      if (st.indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case T::object: {
      if (v.o->empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& kv : *v.o) items.push_back(&kv);
      if (st.sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* x, auto* y) { return x->first < y->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += st.item_sep;
        if (st.indent >= 0) newline(depth + 1);
        out += json_string(items[k]->first, st.ensure_ascii) + st.key_sep;
        dump_json(items[k]->second, st, depth + 1, out);
      }
      if (st.indent >= 0) newline(depth);
      out += '}';
      return;
    }
  }
}

std::string py_repr_string(const std::string& s) {
  bool single = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  char q = single ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out + q;
}

std::string py_str(const Value& v, bool repr = false) {
  switch (v.t) {
    case T::undefined: return "";
    case T::none: return "None";
    case T::boolean: return v.b ? "True" : "False";
    case T::integer: return std::to_string(v.i);
    case T::number: return float_repr(v.d);
    case T::string: return repr ? py_repr_string(v.s) : v.s;
    case T::function: return "<function>";
    case T::array: {
      std::string out = "[";
      for (size_t k = 0; k < v.a->size(); ++k) out += (k ? ", " : "") + py_str((*v.a)[k], true);
      return out + "]";
    }
    case T::object: {
      if (v.is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (auto& [k, x] : *v.o) {
        out += (first ? "" : ", ") + py_repr_string(k) + ": " + py_str(x, true);
        first = false;
      }
      return out + "}";
    }
  }
  return "";
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

const char* type_name(const Value& v) {
  switch (v.t) {
    case T::undefined: return "undefined";
    case T::none: return "none";
    case T::boolean: return "boolean";
    case T::integer: return "integer";
    case T::number: return "float";
    case T::string: return "string";
    case T::array: return "list";
    case T::object: return v.is_namespace ? "namespace" : "mapping";
    case T::function: return "function";
  }
  return "?";
}

// ---- lexer --------------------------------------------------------------------------------------

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

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Splits the source into text, {{ }} and {% %} pieces, dropping comments and applying `-`,
// trim_blocks (one newline after a block or comment tag is removed) and lstrip_blocks (spaces and
// tabs before a block or comment tag on its line are removed), as jinja2's lexer does.
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

// ---- expression tokens ----------------------------------------------------------------------------

struct Tok {
  enum class K { name, str, integer, number, op, end } k;
  std::string s;
  int64_t i = 0;
  double d = 0;
  size_t offset = 0;
};

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
      if (is_float) toks.push_back({Tok::K::number, lit, 0, std::stod(lit), at});
      else toks.push_back({Tok::K::integer, lit, std::stoll(lit), 0, at});
      k = e;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t e = k + 1;
      for (; e < body.size() && body[e] != c; ++e) {
        if (body[e] != '\\' || e + 1 >= body.size()) { v += body[e]; continue; }
        char n = body[++e];
        switch (n) {
          case 'n': v += '\n'; break;
          case 't': v += '\t'; break;
          case 'r': v += '\r'; break;
          case '\\': v += '\\'; break;
          case '\'': v += '\''; break;
          case '"': v += '"'; break;
          case '\n': break;
          default: v += '\\', v += n;
        }
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

}  // namespace

// ---- AST ------------------------------------------------------------------------------------------

struct Expr;
using ExprP = std::shared_ptr<const Expr>;
struct Expr {
  enum class K { literal, name, attr, item, slice, call, filter, test, unary, binary, cond, list, dict } k;
  int line = 0, col = 0;
  std::string name;  // variable, attribute, filter, test, operator
  Value literal;
  std::vector<ExprP> args;  // operands; for call/filter/test: the callee/subject first, then positional args
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negated = false;  // `is not`
};

struct Node;
using NodeP = std::shared_ptr<const Node>;
using Body = std::vector<NodeP>;
struct Node {
  enum class K { text, output, if_, for_, set, set_block, macro, break_, continue_, body } k;
  int line = 0, col = 0;
  std::string text;                                   // text; set/macro: the name
  std::string attr;                                   // set ns.attr
  std::vector<std::string> vars;                      // for: loop variables; macro: parameters
  std::vector<ExprP> exprs;                           // output/set: [value]; for: [iterable, filter?]; macro: defaults
  std::vector<std::pair<ExprP, Body>> branches;       // if/elif/else (else: null condition)
  Body body, else_body;                               // for, set_block, macro, body
};

namespace {

const std::set<std::string> kFilters = {"trim", "length", "count", "tojson", "string", "upper", "lower", "replace",
                                        "join", "default", "d", "items", "selectattr", "rejectattr", "select",
                                        "reject", "map", "first", "last", "list", "int", "float", "abs",
                                        "capitalize", "title", "safe", "reverse", "unique", "sort", "indent",
                                        "wordcount", "dictsort", "sum", "min", "max", "e", "escape"};
const std::set<std::string> kTests = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                      "mapping", "sequence", "iterable", "boolean", "true", "false", "eq",
                                      "equalto", "ne", "odd", "even", "callable", "in", "lower", "upper",
                                      "divisibleby", "gt", "lt", "ge", "le", "sameas"};

class Parser {
 public:
  Parser(const Source& src, std::vector<Piece> pieces) : src_(src), pieces_(std::move(pieces)) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, end);
    return b;
  }

 private:
  const Source& src_;
  std::vector<Piece> pieces_;
  size_t pi_ = 0;
  std::vector<Tok> toks_;
  size_t ti_ = 0;

  // -- statements
  Body parse_body(const std::set<std::string>& ends, std::string& end_kw) {
    Body body;
    while (pi_ < pieces_.size()) {
      const Piece& p = pieces_[pi_++];
      if (p.k == Piece::K::text) {
        if (p.body.empty()) continue;
        auto n = std::make_shared<Node>();
        n->k = Node::K::text;
        n->text = p.body;
        body.push_back(n);
        continue;
      }
      toks_ = tokenize(src_, p.body, p.offset);
      ti_ = 0;
      if (p.k == Piece::K::expr) {
        auto n = make(Node::K::output, peek());
        n->exprs.push_back(parse_expr());
        expect_end();
        body.push_back(n);
        continue;
      }
      const Tok& kw = peek();
      if (kw.k != Tok::K::name) src_.fail_at(kw.offset, "expected a statement name after '{%'");
      if (ends.count(kw.s)) {
        end_kw = kw.s;
        return body;
      }
      body.push_back(parse_statement());
    }
    if (!ends.empty()) src_.fail_at(src_.text.size(), "unexpected end of template: missing {% " + *ends.rbegin() + " %}");
    return body;
  }

  std::shared_ptr<Node> make(Node::K k, const Tok& at) {
    auto n = std::make_shared<Node>();
    n->k = k;
    std::tie(n->line, n->col) = src_.pos(at.offset);
    return n;
  }

  NodeP parse_statement() {
    Tok kw = next();
    if (kw.s == "if") {
      auto n = make(Node::K::if_, kw);
      ExprP cond = parse_expr();
      expect_end();
      for (;;) {
        std::string end;
        Body b = parse_body({"elif", "else", "endif"}, end);
        n->branches.emplace_back(cond, std::move(b));
        next();
        if (end == "endif") { expect_end(); break; }
        if (end == "else") {
          expect_end();
          Body eb = parse_body({"endif"}, end);
          n->branches.emplace_back(nullptr, std::move(eb));
          next();
          expect_end();
          break;
        }
        cond = parse_expr();
        expect_end();
      }
      return n;
    }
    if (kw.s == "for") {
      auto n = make(Node::K::for_, kw);
      do {
        n->vars.push_back(expect_name());
      } while (accept(","));
      if (!accept_name("in")) src_.fail_at(peek().offset, "expected 'in' in for loop");
      n->exprs.push_back(parse_expr(false));
      if (accept_name("if")) n->exprs.push_back(parse_expr(false));
      if (peek().k == Tok::K::name && peek().s == "recursive") src_.fail_at(peek().offset, "unsupported: recursive for loops");
      expect_end();
      std::string end;
      n->body = parse_body({"else", "endfor"}, end);
      next();
      expect_end();
      if (end == "else") {
        n->else_body = parse_body({"endfor"}, end);
        next();
        expect_end();
      }
      return n;
    }
    if (kw.s == "set") {
      std::string name = expect_name();
      std::string attr;
      if (accept(".")) attr = expect_name();
      if (peek().k == Tok::K::op && peek().s == ",") src_.fail_at(peek().offset, "unsupported: tuple assignment in set");
      if (accept("=")) {
        auto n = make(Node::K::set, kw);
        n->text = name;
        n->attr = attr;
        n->exprs.push_back(parse_expr());
        expect_end();
        return n;
      }
      if (!attr.empty()) src_.fail_at(peek().offset, "expected '=' after set target");
      expect_end();
      auto n = make(Node::K::set_block, kw);
      n->text = name;
      std::string end;
      n->body = parse_body({"endset"}, end);
      next();
      expect_end();
      return n;
    }
    if (kw.s == "macro") {
      auto n = make(Node::K::macro, kw);
      n->text = expect_name();
      expect("(");
      while (!accept(")")) {
        n->vars.push_back(expect_name());
        n->exprs.push_back(accept("=") ? parse_expr() : nullptr);
        if (!accept(",")) { expect(")"); break; }
      }
      expect_end();
      std::string end;
      n->body = parse_body({"endmacro"}, end);
      next();
      expect_end();
      return n;
    }
    if (kw.s == "break" || kw.s == "continue") {
      auto n = make(kw.s == "break" ? Node::K::break_ : Node::K::continue_, kw);
      expect_end();
      return n;
    }
    if (kw.s == "generation") {  // transformers' assistant-mask marker: renders its body unchanged
      auto n = make(Node::K::body, kw);
      expect_end();
      std::string end;
      n->body = parse_body({"endgeneration"}, end);
      next();
      expect_end();
      return n;
    }
    src_.fail_at(kw.offset, "unsupported statement '{% " + kw.s + " %}'");
  }

  // -- tokens
  const Tok& peek(size_t ahead = 0) const { return toks_[std::min(ti_ + ahead, toks_.size() - 1)]; }
  Tok next() { return toks_[std::min(ti_++, toks_.size() - 1)]; }
  bool is_op(const std::string& op, size_t ahead = 0) const {
    return peek(ahead).k == Tok::K::op && peek(ahead).s == op;
  }
  bool is_name(const std::string& n, size_t ahead = 0) const {
    return peek(ahead).k == Tok::K::name && peek(ahead).s == n;
  }
  bool accept(const std::string& op) {
    if (!is_op(op)) return false;
    ++ti_;
    return true;
  }
  bool accept_name(const std::string& n) {
    if (!is_name(n)) return false;
    ++ti_;
    return true;
  }
  void expect(const std::string& op) {
    if (!accept(op)) src_.fail_at(peek().offset, "expected '" + op + "', got '" + describe(peek()) + "'");
  }
  std::string expect_name() {
    if (peek().k != Tok::K::name) src_.fail_at(peek().offset, "expected a name, got '" + describe(peek()) + "'");
    return next().s;
  }
  void expect_end() {
    if (peek().k != Tok::K::end) src_.fail_at(peek().offset, "unexpected '" + describe(peek()) + "'");
  }
  static std::string describe(const Tok& t) { return t.k == Tok::K::end ? "end of tag" : t.s; }

  std::shared_ptr<Expr> make_expr(Expr::K k, size_t offset) {
    auto e = std::make_shared<Expr>();
    e->k = k;
    std::tie(e->line, e->col) = src_.pos(offset);
    return e;
  }
  ExprP binary(const std::string& op, ExprP l, ExprP r, size_t offset) {
    auto e = make_expr(Expr::K::binary, offset);
    e->name = op;
    e->args = {std::move(l), std::move(r)};
    return e;
  }

  // -- expressions (jinja2's precedence)
  ExprP parse_expr(bool with_cond = true) {
    size_t at = peek().offset;
    ExprP e = parse_or();
    while (with_cond && is_name("if")) {
      next();
      auto c = make_expr(Expr::K::cond, at);
      ExprP test = parse_or();
      ExprP otherwise;
      if (accept_name("else")) otherwise = parse_expr();
      else otherwise = make_expr(Expr::K::literal, at);
      c->args = {test, e, otherwise};
      e = c;
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) { size_t at = next().offset; e = binary("or", e, parse_and(), at); }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) { size_t at = next().offset; e = binary("and", e, parse_not(), at); }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      auto e = make_expr(Expr::K::unary, next().offset);
      e->name = "not";
      e->args = {parse_not()};
      return e;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    for (;;) {
      size_t at = peek().offset;
      if (peek().k == Tok::K::op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                     peek().s == "<=" || peek().s == ">=")) {
        std::string op = next().s;
        e = binary(op, e, parse_math1(), at);
      } else if (is_name("in")) {
        next();
        e = binary("in", e, parse_math1(), at);
      } else if (is_name("not") && is_name("in", 1)) {
        next(), next();
        e = binary("not in", e, parse_math1(), at);
      } else {
        return e;
      }
    }
  }
  // Left-associative binary operators `ops` over operands parsed by `operand`.
  ExprP left_assoc(std::initializer_list<const char*> ops, ExprP (Parser::*operand)()) {
    ExprP e = (this->*operand)();
    for (;;) {
      const char* hit = nullptr;
      for (const char* op : ops)
        if (is_op(op)) hit = op;
      if (!hit) return e;
      size_t at = next().offset;
      e = binary(hit, e, (this->*operand)(), at);
    }
  }
  ExprP parse_math1() { return left_assoc({"+", "-"}, &Parser::parse_concat); }
  ExprP parse_concat() { return left_assoc({"~"}, &Parser::parse_math2); }
  ExprP parse_math2() { return left_assoc({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprP parse_pow() { return left_assoc({"**"}, &Parser::parse_unary_filtered); }
  ExprP parse_unary_filtered() { return parse_unary(true); }
  ExprP parse_unary(bool with_filter = true) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      Tok op = next();
      auto u = make_expr(Expr::K::unary, op.offset);
      u->name = op.s;
      u->args = {parse_unary(false)};
      e = u;
    } else {
      e = parse_primary();
    }
    e = parse_postfix(e);
    if (with_filter) e = parse_filter_expr(e);
    return e;
  }
  ExprP parse_primary() {
    Tok t = next();
    if (t.k == Tok::K::name) {
      auto e = make_expr(Expr::K::literal, t.offset);
      if (t.s == "true" || t.s == "True") e->literal = Value::boolean(true);
      else if (t.s == "false" || t.s == "False") e->literal = Value::boolean(false);
      else if (t.s == "none" || t.s == "None") e->literal = Value::none();
      else e->k = Expr::K::name, e->name = t.s;
      return e;
    }
    if (t.k == Tok::K::str) {
      auto e = make_expr(Expr::K::literal, t.offset);
      std::string s = t.s;
      while (peek().k == Tok::K::str) s += next().s;
      e->literal = Value::string(s);
      return e;
    }
    if (t.k == Tok::K::integer || t.k == Tok::K::number) {
      auto e = make_expr(Expr::K::literal, t.offset);
      e->literal = t.k == Tok::K::integer ? Value::integer(t.i) : Value::number(t.d);
      return e;
    }
    if (t.k == Tok::K::op && t.s == "(") {
      ExprP inner = parse_expr();
      if (is_op(",")) src_.fail_at(peek().offset, "unsupported: tuples");
      expect(")");
      return inner;
    }
    if (t.k == Tok::K::op && t.s == "[") {
      auto e = make_expr(Expr::K::list, t.offset);
      while (!accept("]")) {
        e->args.push_back(parse_expr());
        if (!accept(",")) { expect("]"); break; }
      }
      return e;
    }
    if (t.k == Tok::K::op && t.s == "{") {
      auto e = make_expr(Expr::K::dict, t.offset);
      while (!accept("}")) {
        e->args.push_back(parse_expr());
        expect(":");
        e->args.push_back(parse_expr());
        if (!accept(",")) { expect("}"); break; }
      }
      return e;
    }
    src_.fail_at(t.offset, "unexpected '" + describe(t) + "'");
  }
  void parse_call_args(Expr& e) {
    while (!accept(")")) {
      if (peek().k == Tok::K::name && is_op("=", 1)) {
        std::string k = next().s;
        next();
        e.kwargs.emplace_back(k, parse_expr());
      } else {
        if (is_op("*") || is_op("**")) src_.fail_at(peek().offset, "unsupported: *args / **kwargs in calls");
        e.args.push_back(parse_expr());
      }
      if (!accept(",")) { expect(")"); break; }
    }
  }
  ExprP parse_postfix(ExprP e) {
    for (;;) {
      if (is_op(".")) {
        size_t at = next().offset;
        auto a = make_expr(Expr::K::attr, at);
        if (peek().k == Tok::K::integer) {
          a->k = Expr::K::item;
          auto idx = make_expr(Expr::K::literal, at);
          idx->literal = Value::integer(next().i);
          a->args = {e, idx};
        } else {
          a->name = expect_name();
          a->args = {e};
        }
        e = a;
      } else if (is_op("[")) {
        size_t at = next().offset;
        ExprP parts[3];
        bool is_slice = false;
        int part = 0;
        while (!is_op("]")) {
          if (accept(":")) {
            is_slice = true;
            if (++part > 2) src_.fail_at(at, "bad slice");
            continue;
          }
          if (parts[part]) src_.fail_at(peek().offset, "expected ']' or ':'");
          parts[part] = parse_expr();
        }
        expect("]");
        auto x = make_expr(is_slice ? Expr::K::slice : Expr::K::item, at);
        x->args = {e, parts[0], parts[1], parts[2]};
        if (!is_slice && !parts[0]) src_.fail_at(at, "empty subscript");
        if (!is_slice) x->args.resize(2);
        e = x;
      } else if (is_op("(")) {
        auto c = make_expr(Expr::K::call, next().offset);
        c->args.push_back(e);
        parse_call_args(*c);
        e = c;
      } else {
        return e;
      }
    }
  }
  ExprP parse_filter_expr(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        next();
        auto f = make_expr(Expr::K::filter, peek().offset);
        size_t name_at = peek().offset;
        f->name = expect_name();
        if (!kFilters.count(f->name)) src_.fail_at(name_at, "unsupported filter '" + f->name + "'");
        f->args.push_back(e);
        if (accept("(")) parse_call_args(*f);
        e = f;
      } else if (is_name("is")) {
        next();
        auto t = make_expr(Expr::K::test, peek().offset);
        t->negated = accept_name("not");
        size_t name_at = peek().offset;
        t->name = expect_name();
        if (!kTests.count(t->name)) src_.fail_at(name_at, "unsupported test 'is " + t->name + "'");
        t->args.push_back(e);
        if (accept("(")) {
          parse_call_args(*t);
        } else if (peek().k == Tok::K::str || peek().k == Tok::K::integer || peek().k == Tok::K::number ||
                   (peek().k == Tok::K::name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is"))) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = t;
      } else if (is_op("(")) {
        auto c = make_expr(Expr::K::call, next().offset);
        c->args.push_back(e);
        parse_call_args(*c);
        e = c;
      } else {
        return e;
      }
    }
  }
};

// ---- evaluation -----------------------------------------------------------------------------------

enum class Flow { normal, break_, continue_ };

class Renderer {
 public:
  explicit Renderer(Object globals) { scopes_.push_back(std::move(globals)); }

  void push() { scopes_.emplace_back(); }
  void pop() { scopes_.pop_back(); }
  void set(const std::string& name, Value v) {
    Object& s = scopes_.back();
    for (auto& [k, old] : s)
      if (k == name) { old = std::move(v); return; }
    s.emplace_back(name, std::move(v));
  }
  Value lookup(const std::string& name) const {
    for (size_t k = scopes_.size(); k-- > 0;) {
      if (k < base_ && k > 1) continue;  // a macro sees its own frame and the template's globals only
      for (auto& [n, v] : scopes_[k])
        if (n == name) return v;
    }
    return {};
  }

  Flow render(const Body& body, std::string& out) {
    for (auto& n : body) {
      Flow f = render(*n, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

 private:
  std::vector<Object> scopes_;
  size_t base_ = 0;

  [[noreturn]] static void err(const Expr& e, const std::string& m) { fail(e.line, e.col, m); }

  Flow render(const Node& n, std::string& out) {
    switch (n.k) {
      case Node::K::text: out += n.text; return Flow::normal;
      case Node::K::output: out += py_str(eval(*n.exprs[0])); return Flow::normal;
      case Node::K::body: return render(n.body, out);
      case Node::K::break_: return Flow::break_;
      case Node::K::continue_: return Flow::continue_;
      case Node::K::if_:
        for (auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond))) return render(body, out);
        return Flow::normal;
      case Node::K::set: {
        Value v = eval(*n.exprs[0]);
        if (n.attr.empty()) {
          set(n.text, std::move(v));
        } else {
          Value target = lookup(n.text);
          if (target.t != T::object || !target.is_namespace)
            fail(n.line, n.col, "cannot assign attribute '" + n.attr + "' of '" + n.text + "': not a namespace()");
          target.put(n.attr, std::move(v));
        }
        return Flow::normal;
      }
      case Node::K::set_block: {
        std::string captured;
        render(n.body, captured);
        set(n.text, Value::string(captured));
        return Flow::normal;
      }
      case Node::K::macro: {
        auto node = &n;  // the AST outlives the render
        set(n.text, Value::function([this, node](const Args& args, const Kwargs& kwargs) {
              return call_macro(*node, args, kwargs);
            }));
        return Flow::normal;
      }
      case Node::K::for_: return render_for(n, out);
    }
    return Flow::normal;
  }

  Value call_macro(const Node& m, const Args& args, const Kwargs& kwargs) {
    if (args.size() > m.vars.size()) fail(m.line, m.col, "macro '" + m.text + "' called with too many arguments");
    size_t saved_base = base_;
    push();
    base_ = scopes_.size() - 1;
    for (size_t k = 0; k < m.vars.size(); ++k) {
      Value v;
      if (k < args.size()) v = args[k];
      else if (m.exprs[k]) v = eval(*m.exprs[k]);
      for (auto& [name, kv] : kwargs)
        if (name == m.vars[k]) v = kv;
      set(m.vars[k], v);
    }
    std::string out;
    render(m.body, out);
    pop();
    base_ = saved_base;
    return Value::string(out);
  }

  std::vector<Value> iterate(const Value& v, const Expr& where) {
    switch (v.t) {
      case T::undefined: return {};
      case T::array: return *v.a;
      case T::object: {
        std::vector<Value> keys;
        for (auto& kv : *v.o) keys.push_back(Value::string(kv.first));
        return keys;
      }
      case T::string: {
        std::vector<Value> chars;
        for (auto& c : utf8_chars(v.s)) chars.push_back(Value::string(c));
        return chars;
      }
      default: err(where, std::string("cannot iterate over a ") + type_name(v));
    }
  }

  Flow render_for(const Node& n, std::string& out) {
    std::vector<Value> items = iterate(eval(*n.exprs[0]), *n.exprs[0]);
    auto bind = [&](const Value& item) {
      if (n.vars.size() == 1) { set(n.vars[0], item); return; }
      if (item.t != T::array || item.a->size() != n.vars.size())
        fail(n.line, n.col, "cannot unpack a " + std::string(type_name(item)) + " into " + std::to_string(n.vars.size()) + " loop variables");
      for (size_t k = 0; k < n.vars.size(); ++k) set(n.vars[k], (*item.a)[k]);
    };
    push();
    if (n.exprs.size() > 1) {  // `for x in xs if cond`: filter first, loop.* counts what remains
      std::vector<Value> kept;
      for (auto& it : items) {
        bind(it);
        if (truthy(eval(*n.exprs[1]))) kept.push_back(it);
      }
      items = std::move(kept);
    }
    pop();
    if (items.empty()) return render(n.else_body, out);
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      push();
      bind(items[static_cast<size_t>(k)]);
      Object loop = {{"index0", Value::integer(k)},
                     {"index", Value::integer(k + 1)},
                     {"revindex0", Value::integer(len - k - 1)},
                     {"revindex", Value::integer(len - k)},
                     {"first", Value::boolean(k == 0)},
                     {"last", Value::boolean(k == len - 1)},
                     {"length", Value::integer(len)},
                     {"previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value{}},
                     {"nextitem", k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value{}}};
      set("loop", Value::object(std::move(loop)));
      Flow f = render(n.body, out);
      pop();
      if (f == Flow::break_) break;
    }
    return Flow::normal;
  }

  // -- expressions
  Value eval(const Expr& e) {
    switch (e.k) {
      case Expr::K::literal: return e.literal;
      case Expr::K::name: return lookup(e.name);
      case Expr::K::list: {
        Array a;
        for (auto& x : e.args) a.push_back(eval(*x));
        return Value::array(std::move(a));
      }
      case Expr::K::dict: {
        Value o = Value::object();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (!key.is_str()) err(*e.args[k], "dict keys must be strings");
          o.put(key.s, eval(*e.args[k + 1]));
        }
        return o;
      }
      case Expr::K::attr: return get_attr(eval(*e.args[0]), e.name, e);
      case Expr::K::item: return get_item(eval(*e.args[0]), eval(*e.args[1]), e);
      case Expr::K::slice: return slice(e);
      case Expr::K::cond: return truthy(eval(*e.args[0])) ? eval(*e.args[1]) : eval(*e.args[2]);
      case Expr::K::unary: {
        Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (!v.is_num()) err(e, std::string("bad operand for unary ") + e.name + ": " + type_name(v));
        if (e.name == "+") return v;
        return v.t == T::integer ? Value::integer(-v.i) : Value::number(-v.d);
      }
      case Expr::K::binary: return binary(e);
      case Expr::K::call: return call(e);
      case Expr::K::filter: return filter(e);
      case Expr::K::test: {
        bool r = test(e.name, eval(*e.args[0]), e);
        return Value::boolean(e.negated ? !r : r);
      }
    }
    return {};
  }

  Value get_attr(const Value& v, const std::string& name, const Expr& e) {
    if (v.t == T::undefined) err(e, "cannot read attribute '" + name + "' of an undefined value");
    if (v.t == T::object)
      if (const Value* x = v.find(name)) return *x;
    return {};
  }

  static int64_t norm_index(int64_t k, size_t n) { return k < 0 ? k + static_cast<int64_t>(n) : k; }

  Value get_item(const Value& v, const Value& key, const Expr& e) {
    if (v.t == T::undefined) err(e, "cannot subscript an undefined value");
    if (v.t == T::object && key.is_str()) {
      if (const Value* x = v.find(key.s)) return *x;
      return {};
    }
    if ((v.t == T::array || v.t == T::string) && key.t == T::integer) {
      if (v.t == T::array) {
        int64_t k = norm_index(key.i, v.a->size());
        if (k < 0 || k >= static_cast<int64_t>(v.a->size())) return {};
        return (*v.a)[static_cast<size_t>(k)];
      }
      auto chars = utf8_chars(v.s);
      int64_t k = norm_index(key.i, chars.size());
      if (k < 0 || k >= static_cast<int64_t>(chars.size())) return {};
      return Value::string(chars[static_cast<size_t>(k)]);
    }
    return {};
  }

  Value slice(const Expr& e) {
    Value v = eval(*e.args[0]);
    std::vector<Value> items;
    if (v.t == T::array) items = *v.a;
    else if (v.t == T::string) for (auto& c : utf8_chars(v.s)) items.push_back(Value::string(c));
    else err(e, std::string("cannot slice a ") + type_name(v));
    auto get = [&](size_t k) -> std::optional<int64_t> {
      if (!e.args[k]) return std::nullopt;
      Value x = eval(*e.args[k]);
      if (x.t == T::none) return std::nullopt;
      if (x.t != T::integer) err(e, "slice indices must be integers");
      return x.i;
    };
    auto n = static_cast<int64_t>(items.size());
    int64_t step = get(3).value_or(1);
    if (step == 0) err(e, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
      if (!x) return dflt;
      int64_t k = *x < 0 ? *x + n : *x;
      if (step > 0) return std::clamp<int64_t>(k, 0, n);
      return std::clamp<int64_t>(k, -1, n - 1);
    };
    int64_t start = clamp(get(1), step > 0 ? 0 : n - 1), stop = clamp(get(2), step > 0 ? n : -1);
    std::vector<Value> out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(items[static_cast<size_t>(k)]);
    if (v.t == T::array) return Value::array(std::move(out));
    std::string s;
    for (auto& c : out) s += c.s;
    return Value::string(s);
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.args[0]);
      return truthy(l) ? eval(*e.args[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*e.args[0]);
      return truthy(l) ? l : eval(*e.args[1]);
    }
    Value l = eval(*e.args[0]), r = eval(*e.args[1]);
    if (op == "~") return Value::string(py_str(l) + py_str(r));
    if (op == "==") return Value::boolean(equal(l, r));
    if (op == "!=") return Value::boolean(!equal(l, r));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.t == T::string && l.t == T::string) found = r.s.find(l.s) != std::string::npos;
      else if (r.t == T::array) found = std::any_of(r.a->begin(), r.a->end(), [&](const Value& x) { return equal(x, l); });
      else if (r.t == T::object) found = l.is_str() && r.find(l.s) != nullptr;
      else if (r.t == T::undefined) err(e, "'in' on an undefined value");
      else err(e, std::string("'in' needs a string, list or mapping on the right, got ") + type_name(r));
      return Value::boolean(op == "in" ? found : !found);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (l.is_num() && r.is_num()) c = l.as_double() < r.as_double() ? -1 : l.as_double() > r.as_double() ? 1 : 0;
      else if (l.is_str() && r.is_str()) c = l.s.compare(r.s) < 0 ? -1 : l.s == r.s ? 0 : 1;
      else err(e, std::string("cannot compare ") + type_name(l) + " and " + type_name(r));
      bool res = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
      return Value::boolean(res);
    }
    if (op == "+") {
      if (l.is_str() && r.is_str()) return Value::string(l.s + r.s);
      if (l.t == T::array && r.t == T::array) {
        Array a = *l.a;
        a.insert(a.end(), r.a->begin(), r.a->end());
        return Value::array(std::move(a));
      }
    }
    if (op == "*" && l.is_str() && r.t == T::integer) {
      std::string s;
      for (int64_t k = 0; k < r.i; ++k) s += l.s;
      return Value::string(s);
    }
    auto num = [&](const Value& v) {
      if (v.t == T::boolean) return Value::integer(v.b);
      if (!v.is_num()) err(e, "unsupported operand types for " + op + ": " + type_name(l) + " and " + type_name(r));
      return v;
    };
    Value a = num(l), b = num(r);
    bool ints = a.t == T::integer && b.t == T::integer;
    if (op == "+") return ints ? Value::integer(a.i + b.i) : Value::number(a.as_double() + b.as_double());
    if (op == "-") return ints ? Value::integer(a.i - b.i) : Value::number(a.as_double() - b.as_double());
    if (op == "*") return ints ? Value::integer(a.i * b.i) : Value::number(a.as_double() * b.as_double());
    if (op == "**") return ints && b.i >= 0 ? Value::integer(static_cast<int64_t>(std::llround(std::pow(a.i, b.i))))
                                             : Value::number(std::pow(a.as_double(), b.as_double()));
    if (b.as_double() == 0) err(e, "division by zero");
    if (op == "/") return Value::number(a.as_double() / b.as_double());
    if (op == "//") {
      if (ints) return Value::integer(static_cast<int64_t>(std::floor(static_cast<double>(a.i) / static_cast<double>(b.i))));
      return Value::number(std::floor(a.as_double() / b.as_double()));
    }
    if (ints) return Value::integer(((a.i % b.i) + b.i) % b.i);
    return Value::number(a.as_double() - b.as_double() * std::floor(a.as_double() / b.as_double()));
  }

  void eval_args(const Expr& e, size_t from, Args& args, Kwargs& kwargs) {
    for (size_t k = from; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    for (auto& [name, x] : e.kwargs) kwargs.emplace_back(name, eval(*x));
  }
  static const Value* kwarg(const Kwargs& kw, const std::string& name) {
    for (auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
  // Positional argument `pos` or keyword `name`, else undefined.
  static Value arg(const Args& a, const Kwargs& kw, size_t pos, const std::string& name) {
    if (pos < a.size()) return a[pos];
    if (const Value* v = kwarg(kw, name)) return *v;
    return {};
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    Args args;
    Kwargs kwargs;
    if (callee.k == Expr::K::attr) {
      Value self = eval(*callee.args[0]);
      eval_args(e, 1, args, kwargs);
      if (self.t == T::string || (self.t == T::object && !self.find(callee.name)))
        return method(self, callee.name, args, kwargs, e);
      Value fn = get_attr(self, callee.name, callee);
      if (fn.t != T::function) err(e, "'" + callee.name + "' is not callable");
      return (*fn.f)(args, kwargs);
    }
    Value fn = eval(callee);
    eval_args(e, 1, args, kwargs);
    if (fn.t != T::function) {
      std::string what = callee.k == Expr::K::name ? "'" + callee.name + "'" : "the value";
      err(e, what + (fn.defined() ? " is not callable" : " is undefined (unsupported function)"));
    }
    try {
      return (*fn.f)(args, kwargs);
    } catch (TemplateError& t) {
      if (t.line == 0) t.line = e.line, t.col = e.col;
      throw;
    }
  }

  static std::string strip_chars(const Value& chars) { return chars.is_str() ? chars.s : std::string(" \t\n\r\v\f"); }

  Value method(const Value& self, const std::string& name, const Args& a, const Kwargs& kw, const Expr& e) {
    if (self.t == T::string) {
      const std::string& s = self.s;
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        std::string chars = strip_chars(arg(a, kw, 0, "chars"));
        size_t b = 0, en = s.size();
        if (name != "rstrip") while (b < en && chars.find(s[b]) != std::string::npos) ++b;
        if (name != "lstrip") while (en > b && chars.find(s[en - 1]) != std::string::npos) --en;
        return Value::string(s.substr(b, en - b));
      }
      if (name == "startswith" || name == "endswith") {
        Value p = arg(a, kw, 0, "prefix");
        std::vector<std::string> options;
        if (p.is_str()) options.push_back(p.s);
        else if (p.t == T::array) for (auto& x : *p.a) options.push_back(py_str(x));
        else err(e, name + "() needs a string");
        for (auto& o : options) {
          if (o.size() > s.size()) continue;
          if (name == "startswith" ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "split" || name == "rsplit") {
        Value sep = arg(a, kw, 0, "sep");
        Value maxv = arg(a, kw, 1, "maxsplit");
        int64_t maxsplit = maxv.t == T::integer ? maxv.i : -1;
        if (name == "rsplit" && maxsplit >= 0) err(e, "unsupported: rsplit with maxsplit");
        Array parts;
        if (!sep.is_str()) {
          size_t k = 0;
          int64_t done = 0;
          while (k < s.size()) {
            while (k < s.size() && is_space(s[k])) ++k;
            if (k >= s.size()) break;
            if (maxsplit >= 0 && done == maxsplit) {
              parts.push_back(Value::string(s.substr(k)));
              break;
            }
            size_t en = k;
            while (en < s.size() && !is_space(s[en])) ++en;
            parts.push_back(Value::string(s.substr(k, en - k)));
            ++done;
            k = en;
          }
        } else {
          if (sep.s.empty()) err(e, "split(): empty separator");
          size_t k = 0;
          int64_t done = 0;
          for (;;) {
            size_t f = s.find(sep.s, k);
            if (f == std::string::npos || (maxsplit >= 0 && done == maxsplit)) break;
            parts.push_back(Value::string(s.substr(k, f - k)));
            k = f + sep.s.size();
            ++done;
          }
          parts.push_back(Value::string(s.substr(k)));
        }
        return Value::array(std::move(parts));
      }
      if (name == "upper" || name == "lower") return filter_case(name, self);
      if (name == "title" || name == "capitalize") return filter_case(name, self);
      if (name == "replace") return replace(s, arg(a, kw, 0, "old"), arg(a, kw, 1, "new"), arg(a, kw, 2, "count"), e);
      if (name == "find") {
        Value sub = arg(a, kw, 0, "sub");
        if (!sub.is_str()) err(e, "find() needs a string");
        size_t f = s.find(sub.s);
        return Value::integer(f == std::string::npos ? -1 : static_cast<int64_t>(f));
      }
      if (name == "join") {
        Value items = arg(a, kw, 0, "iterable");
        std::string out;
        bool first = true;
        for (auto& x : iterate(items, e)) {
          out += (first ? "" : s) + py_str(x);
          first = false;
        }
        return Value::string(out);
      }
      err(e, "unsupported string method '" + name + "'");
    }
    if (self.t == T::object && !self.is_namespace) {
      if (name == "items") {
        Array out;
        for (auto& [k, v] : *self.o) out.push_back(Value::array({Value::string(k), v}));
        return Value::array(std::move(out));
      }
      if (name == "keys" || name == "values") {
        Array out;
        for (auto& [k, v] : *self.o) out.push_back(name == "keys" ? Value::string(k) : v);
        return Value::array(std::move(out));
      }
      if (name == "get") {
        Value key = arg(a, kw, 0, "key");
        if (key.is_str())
          if (const Value* v = self.find(key.s)) return *v;
        Value d = arg(a, kw, 1, "default");
        return d.defined() ? d : Value::none();
      }
      err(e, "unsupported mapping method '" + name + "'");
    }
    err(e, std::string("unsupported method '") + name + "' on a " + type_name(self));
  }

  static Value filter_case(const std::string& name, const Value& v) {
    std::string s = py_str(v);
    bool start = true;
    for (char& c : s) {
      auto u = static_cast<unsigned char>(c);
      if (name == "upper") c = static_cast<char>(std::toupper(u));
      else if (name == "lower") c = static_cast<char>(std::tolower(u));
      else if (name == "capitalize") c = static_cast<char>(start ? std::toupper(u) : std::tolower(u)), start = false;
      else {  // title
        c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
        start = !std::isalpha(u);
      }
    }
    return Value::string(s);
  }

  Value replace(const std::string& s, const Value& from, const Value& to, const Value& count, const Expr& e) {
    if (!from.is_str() || !to.is_str()) err(e, "replace() needs two strings");
    int64_t left = count.t == T::integer ? count.i : -1;
    std::string out;
    size_t k = 0;
    if (from.s.empty()) err(e, "unsupported: replace() of an empty string");
    for (;;) {
      size_t f = s.find(from.s, k);
      if (f == std::string::npos || left == 0) break;
      out += s.substr(k, f - k) + to.s;
      k = f + from.s.size();
      --left;
    }
    return Value::string(out + s.substr(k));
  }

  bool test(const std::string& name, const Value& v, const Expr& e) {
    Args a;
    Kwargs kw;
    eval_args(e, 1, a, kw);
    Value x = arg(a, kw, 0, "value");
    if (name == "defined") return v.defined();
    if (name == "undefined") return !v.defined();
    if (name == "none") return v.t == T::none;
    if (name == "string") return v.t == T::string;
    if (name == "number") return v.is_num();
    if (name == "integer") return v.t == T::integer;
    if (name == "float") return v.t == T::number;
    if (name == "boolean") return v.t == T::boolean;
    if (name == "true") return v.t == T::boolean && v.b;
    if (name == "false") return v.t == T::boolean && !v.b;
    if (name == "mapping") return v.t == T::object;
    if (name == "sequence" || name == "iterable") return v.t == T::array || v.t == T::string || v.t == T::object;
    if (name == "callable") return v.t == T::function;
    if (name == "eq" || name == "equalto" || name == "sameas") return equal(v, x);
    if (name == "ne") return !equal(v, x);
    if (name == "lower" || name == "upper") return v.is_str() && py_str(filter_case(name, v)) == v.s;
    if (name == "in") {
      if (x.t == T::array) return std::any_of(x.a->begin(), x.a->end(), [&](const Value& y) { return equal(v, y); });
      if (x.t == T::string) return v.is_str() && x.s.find(v.s) != std::string::npos;
      if (x.t == T::object) return v.is_str() && x.find(v.s);
      err(e, "'is in' needs a container");
    }
    if (!v.is_num()) err(e, "test '" + name + "' needs a number, got a " + type_name(v));
    if (name == "odd" || name == "even") {
      if (v.t != T::integer) err(e, "test '" + name + "' needs an integer");
      return (v.i % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") return x.t == T::integer && x.i != 0 && v.t == T::integer && v.i % x.i == 0;
    if (!x.is_num()) err(e, "test '" + name + "' needs a number to compare with");
    double p = v.as_double(), q = x.as_double();
    if (name == "gt") return p > q;
    if (name == "lt") return p < q;
    if (name == "ge") return p >= q;
    return p <= q;
  }

  size_t length(const Value& v, const Expr& e) {
    switch (v.t) {
      case T::undefined: return 0;
      case T::string: return utf8_chars(v.s).size();
      case T::array: return v.a->size();
      case T::object: return v.o->size();
      default: err(e, std::string("a ") + type_name(v) + " has no length");
    }
  }

  Value attribute_path(const Value& v, const Value& path, const Expr& e) {
    Value cur = v;
    std::string p = py_str(path);
    size_t k = 0;
    while (k <= p.size()) {
      size_t dot = p.find('.', k);
      std::string part = p.substr(k, dot == std::string::npos ? std::string::npos : dot - k);
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
      if (!cur.defined()) return cur;
      cur = digits ? get_item(cur, Value::integer(std::stoll(part)), e) : get_attr(cur, part, e);
      if (dot == std::string::npos) break;
      k = dot + 1;
    }
    return cur;
  }

  Value filter(const Expr& e) {
    Value v = eval(*e.args[0]);
    Args a;
    Kwargs kw;
    eval_args(e, 1, a, kw);
    const std::string& f = e.name;
    if (f == "safe" || f == "e" || f == "escape") {
      if (f != "safe") err(e, "unsupported filter '" + f + "' (HTML escaping)");
      return v;
    }
    if (f == "trim") {
      if (!v.is_str()) v = Value::string(py_str(v));
      std::string chars = strip_chars(arg(a, kw, 0, "chars"));
      size_t b = 0, en = v.s.size();
      while (b < en && chars.find(v.s[b]) != std::string::npos) ++b;
      while (en > b && chars.find(v.s[en - 1]) != std::string::npos) --en;
      return Value::string(v.s.substr(b, en - b));
    }
    if (f == "length" || f == "count") return Value::integer(static_cast<int64_t>(length(v, e)));
    if (f == "string") return Value::string(py_str(v));
    if (f == "upper" || f == "lower" || f == "capitalize" || f == "title") return filter_case(f, v);
    if (f == "replace") return replace(py_str(v), arg(a, kw, 0, "old"), arg(a, kw, 1, "new"), arg(a, kw, 2, "count"), e);
    if (f == "tojson") {
      JsonStyle st;
      Value indent = arg(a, kw, 1000, "indent");
      if (indent.t == T::integer) st.indent = static_cast<int>(indent.i), st.item_sep = ",";
      if (!a.empty() && a[0].t == T::integer) st.indent = static_cast<int>(a[0].i), st.item_sep = ",";
      if (const Value* x = kwarg(kw, "ensure_ascii")) st.ensure_ascii = truthy(*x);
      if (const Value* x = kwarg(kw, "sort_keys")) st.sort_keys = truthy(*x);
      if (const Value* x = kwarg(kw, "separators"); x && x->t == T::array && x->a->size() == 2)
        st.item_sep = py_str((*x->a)[0]), st.key_sep = py_str((*x->a)[1]);
      std::string out;
      try {
        dump_json(v, st, 0, out);
      } catch (TemplateError&) {
        err(e, "tojson: a function is not JSON");
      }
      return Value::string(out);
    }
    if (f == "join") {
      Value sep = arg(a, kw, 0, "d");
      Value attr = arg(a, kw, 1, "attribute");
      std::string out;
      bool first = true;
      for (auto& x : iterate(v, e)) {
        out += (first ? "" : py_str(sep)) + py_str(attr.defined() ? attribute_path(x, attr, e) : x);
        first = false;
      }
      return Value::string(out);
    }
    if (f == "default" || f == "d") {
      Value dflt = arg(a, kw, 0, "default_value");
      bool boolean = truthy(arg(a, kw, 1, "boolean"));
      if (!v.defined() || (boolean && !truthy(v))) return dflt.defined() ? dflt : Value::string("");
      return v;
    }
    if (f == "items") {
      if (v.t == T::undefined) return Value::array();
      if (v.t != T::object) err(e, "items needs a mapping");
      return method(v, "items", {}, {}, e);
    }
    if (f == "list") return Value::array(iterate(v, e));
    if (f == "first" || f == "last") {
      auto items = iterate(v, e);
      if (items.empty()) return {};
      return f == "first" ? items.front() : items.back();
    }
    if (f == "reverse") {
      if (v.is_str()) {
        auto cs = utf8_chars(v.s);
        std::string out;
        for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
        return Value::string(out);
      }
      auto items = iterate(v, e);
      std::reverse(items.begin(), items.end());
      return Value::array(std::move(items));
    }
    if (f == "int") {
      if (v.t == T::integer) return v;
      if (v.t == T::number) return Value::integer(static_cast<int64_t>(v.d));
      if (v.is_str()) {
        try {
          return Value::integer(std::stoll(v.s));
        } catch (...) {
        }
      }
      Value d = arg(a, kw, 0, "default");
      return d.defined() ? d : Value::integer(0);
    }
    if (f == "float") {
      if (v.is_num()) return Value::number(v.as_double());
      if (v.is_str()) {
        try {
          return Value::number(std::stod(v.s));
        } catch (...) {
        }
      }
      return Value::number(0);
    }
    if (f == "abs") {
      if (!v.is_num()) err(e, "abs needs a number");
      return v.t == T::integer ? Value::integer(v.i < 0 ? -v.i : v.i) : Value::number(std::fabs(v.d));
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      bool by_attr = f == "selectattr" || f == "rejectattr";
      bool keep = f == "selectattr" || f == "select";
      size_t t = by_attr ? 1 : 0;
      Array out;
      for (auto& x : iterate(v, e)) {
        Value subject = by_attr ? attribute_path(x, a.empty() ? Value{} : a[0], e) : x;
        bool r;
        if (a.size() > t) {
          std::string test_name = py_str(a[t]);
          if (!kTests.count(test_name)) err(e, "unsupported test '" + test_name + "' in " + f);
          auto te = std::make_shared<Expr>(e);
          te->args.resize(1);
          te->kwargs.clear();
          for (size_t k = t + 1; k < a.size(); ++k) {
            auto lit = std::make_shared<Expr>();
            lit->k = Expr::K::literal;
            lit->literal = a[k];
            te->args.push_back(lit);
          }
          r = test(test_name, subject, *te);
        } else {
          r = truthy(subject);
        }
        if (r == keep) out.push_back(x);
      }
      return Value::array(std::move(out));
    }
    if (f == "map") {
      Array out;
      const Value* attr = kwarg(kw, "attribute");
      Value dflt = kwarg(kw, "default") ? *kwarg(kw, "default") : Value{};
      if (!attr && (a.empty() || !a[0].is_str())) err(e, "map needs attribute= or a filter name");
      std::string fname = attr ? "" : a[0].s;
      if (!attr && fname != "string" && fname != "trim" && fname != "lower" && fname != "upper" && fname != "length" &&
          fname != "tojson" && fname != "int" && fname != "first" && fname != "last")
        err(e, "unsupported: map('" + fname + "')");
      for (auto& x : iterate(v, e)) {
        if (attr) {
          Value y = attribute_path(x, *attr, e);
          out.push_back(y.defined() || !dflt.defined() ? y : dflt);
          continue;
        }
        auto fe = std::make_shared<Expr>(e);
        auto lit = std::make_shared<Expr>();
        lit->k = Expr::K::literal;
        lit->literal = x;
        fe->name = fname;
        fe->args = {lit};
        fe->kwargs.clear();
        out.push_back(filter(*fe));
      }
      return Value::array(std::move(out));
    }
    if (f == "indent") {
      Value w = arg(a, kw, 0, "width");
      std::string pad = w.is_str() ? w.s : std::string(static_cast<size_t>(w.t == T::integer ? w.i : 4), ' ');
      bool first = truthy(arg(a, kw, 1, "first")), blank = truthy(arg(a, kw, 2, "blank"));
      std::string s = py_str(v), out;
      size_t k = 0;
      bool line0 = true;
      while (k <= s.size()) {
        size_t nl = s.find('\n', k);
        std::string line = s.substr(k, nl == std::string::npos ? std::string::npos : nl - k);
        if ((!line0 || first) && (blank || !line.empty())) out += pad;
        out += line;
        if (nl == std::string::npos) break;
        out += '\n';
        k = nl + 1;
        line0 = false;
      }
      return Value::string(out);
    }
    if (f == "unique" || f == "sort" || f == "dictsort" || f == "sum" || f == "min" || f == "max" || f == "wordcount") {
      if (f == "wordcount") {
        Value sp = method(Value::string(py_str(v)), "split", {}, {}, e);
        return Value::integer(static_cast<int64_t>(sp.a->size()));
      }
      auto items = iterate(v, e);
      if (f == "unique") {
        Array out;
        for (auto& x : items)
          if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
        return Value::array(std::move(out));
      }
      if (f == "sum") {
        Value acc = Value::integer(0);
        for (auto& x : items) {
          if (!x.is_num()) err(e, "sum needs numbers");
          acc = acc.t == T::integer && x.t == T::integer ? Value::integer(acc.i + x.i)
                                                          : Value::number(acc.as_double() + x.as_double());
        }
        return acc;
      }
      err(e, "unsupported filter '" + f + "'");
    }
    err(e, "unsupported filter '" + f + "'");
  }
};

Object make_globals() {
  Object g;
  g.emplace_back("raise_exception", Value::function([](const Args& a, const Kwargs&) -> Value {
                   throw TemplateError{0, 0, "the template raised an exception: " + (a.empty() ? "" : py_str(a[0]))};
                 }));
  g.emplace_back("namespace", Value::function([](const Args& a, const Kwargs& kw) {
                   Value ns = Value::object();
                   ns.is_namespace = true;
                   for (auto& x : a)
                     if (x.t == T::object)
                       for (auto& [k, v] : *x.o) ns.put(k, v);
                   for (auto& [k, v] : kw) ns.put(k, v);
                   return ns;
                 }));
  g.emplace_back("dict", Value::function([](const Args& a, const Kwargs& kw) {
                   Value d = Value::object();
                   for (auto& [k, v] : kw) d.put(k, v);
                   return d;
                 }));
  g.emplace_back("range", Value::function([](const Args& a, const Kwargs&) {
                   int64_t start = 0, stop = 0, step = 1;
                   auto n = [&](size_t k) { return a.size() > k && a[k].t == T::integer ? a[k].i : 0; };
                   if (a.size() == 1) stop = n(0);
                   else start = n(0), stop = n(1), step = a.size() > 2 ? n(2) : 1;
                   if (step == 0) throw TemplateError{0, 0, "range() step cannot be zero"};
                   Array out;
                   for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(Value::integer(k));
                   return Value::array(std::move(out));
                 }));
  g.emplace_back("strftime_now", Value::function([](const Args& a, const Kwargs&) {
                   std::time_t now = std::time(nullptr);
                   std::tm tm{};
                   localtime_r(&now, &tm);
                   char buf[256];
                   std::string fmt = a.empty() ? "" : py_str(a[0]);
                   size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
                   return Value::string(std::string(buf, n));
                 }));
  return g;
}

Error as_error(const std::string& origin, const TemplateError& t) {
  std::string where = origin + (t.line > 0 ? ":" + std::to_string(t.line) + ":" + std::to_string(t.col) : "");
  return invalid_input(where + ": " + t.message);
}

}  // namespace
}  // namespace jinja

Result<ChatTemplate> ChatTemplate::parse(std::string_view source, const std::string& origin) {
  try {
    jinja::Source src(source);
    jinja::Parser p(src, jinja::lex(src));
    auto root = std::make_shared<jinja::Node>();
    root->k = jinja::Node::K::body;
    root->body = p.parse_all();
    ChatTemplate t;
    t.root_ = std::move(root);
    t.origin_ = origin;
    return t;
  } catch (const jinja::TemplateError& e) {
    return jinja::as_error(origin, e);
  }
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object()) return invalid_input(origin_ + ": template variables must be a JSON object");
  try {
    jinja::Renderer r(jinja::make_globals());
    r.push();
    for (auto it = variables.begin(); it != variables.end(); ++it) r.set(it.key(), jinja::from_json(it.value()));
    std::string out;
    r.render(root_->body, out);
    return out;
  } catch (const jinja::TemplateError& e) {
    return jinja::as_error(origin_, e);
  }
}

Result<std::string> render_chat(const ChatTemplate& t, const nlohmann::ordered_json& messages,
                                const ChatRenderOptions& o) {
  if (!messages.is_array()) return invalid_input(t.origin() + ": messages must be a JSON list");
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) return invalid_input(t.origin() + ": each message must be a JSON object");
    nlohmann::ordered_json reasoning;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (m.contains(key) && !m[key].is_null()) { reasoning = m[key]; break; }
    if (reasoning.is_null()) { msgs.push_back(m); continue; }
    nlohmann::ordered_json aliased = {{"thinking", reasoning}};  // transformers: {"thinking": r, **m, "reasoning_content": r}
    for (auto it = m.begin(); it != m.end(); ++it) aliased[it.key()] = it.value();
    aliased["reasoning_content"] = reasoning;
    msgs.push_back(std::move(aliased));
  }
  nlohmann::ordered_json vars = {{"messages", msgs}, {"tools", o.tools}, {"documents", nullptr},
                                 {"add_generation_prompt", o.add_generation_prompt},
                                 {"bos_token", o.bos_token}, {"eos_token", o.eos_token}};
  for (auto it = o.extra.begin(); it != o.extra.end(); ++it) vars[it.key()] = it.value();
  return t.render(vars);
}

Result<std::string> read_chat_template_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path jinja_file = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja_file)) {
    std::ifstream in(jinja_file, std::ios::binary);
    if (!in) return invalid_input(jinja_file.string() + ": cannot read");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  const fs::path cfg = fs::path(dir) / "tokenizer_config.json";
  if (!fs::exists(cfg)) return std::string();
  nlohmann::json j;
  try {
    std::ifstream in(cfg);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return invalid_input(cfg.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("chat_template") || j["chat_template"].is_null()) return std::string();
  const auto& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const auto& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        return e["template"].get<std::string>();
    return invalid_input(cfg.string() + ": chat_template is a list without a \"default\" entry");
  }
  return invalid_input(cfg.string() + ": chat_template must be a string or a list of {name, template}");
}

Result<std::shared_ptr<const ChatTemplate>> load_chat_template_dir(const std::string& path) {
  // a GGUF's template is in its import's tokenizer_config.json
  TROUPE_ASSIGN_OR_RETURN(std::string dir, model_dir_for(path));
  TROUPE_ASSIGN_OR_RETURN(std::string text, read_chat_template_dir(dir));
  if (text.empty()) return std::shared_ptr<const ChatTemplate>();
  namespace fs = std::filesystem;
  const std::string origin = fs::exists(fs::path(dir) / "chat_template.jinja")
                                 ? (fs::path(dir) / "chat_template.jinja").string()
                                 : (fs::path(dir) / "tokenizer_config.json").string() + " chat_template";
  TROUPE_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::parse(text, origin));
  return std::shared_ptr<const ChatTemplate>(std::make_shared<ChatTemplate>(std::move(t)));
}

ChatRenderOptions chat_options_for(const Tokenizer* tokenizer, int32_t bos_id, int32_t eos_id) {
  ChatRenderOptions o;
  auto text = [&](int32_t id) -> nlohmann::ordered_json {
    if (!tokenizer || id < 0) return nullptr;
    auto s = tokenizer->decode({id}, /*skip_special=*/false);
    return s.ok() ? nlohmann::ordered_json(*s) : nlohmann::ordered_json(nullptr);
  };
  o.bos_token = text(bos_id);
  o.eos_token = text(eos_id);
  return o;
}

}  // namespace troupe::policy::io
