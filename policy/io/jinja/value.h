// Values of the chat-template Jinja subset (jinja/*.cpp, chat_template.cpp): JSON-like values with
// Python's semantics where templates rely on them (truthiness, ==, str(), repr(), json.dumps).
// Invariant: errors inside the jinja/ files are thrown as TemplateError (line, column, message);
// only chat_template.cpp's public entry points catch them and turn them into a troupe::Error.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::policy::io::jinja {

struct TemplateError {
  int line, col;
  std::string message;
};

[[noreturn]] inline void fail(int line, int col, std::string message) { throw TemplateError{line, col, std::move(message)}; }

// What one render may build (a template is untrusted input: a loop or a doubling must end in an
// error, not in exhausted memory): the longest string or list, and range()'s length (jinja2's
// sandbox allows 100000).
inline constexpr size_t kMaxStringBytes = size_t{4} << 20;
inline constexpr size_t kMaxListItems = size_t{1} << 20;
inline constexpr int64_t kMaxRange = 100000;
inline constexpr int kMaxValueDepth = 128;  // lists and mappings inside each other
// Appends to a string a render builds, refusing to pass kMaxStringBytes.
inline void append_bounded(std::string& out, std::string_view more) {
  if (out.size() + more.size() > kMaxStringBytes) fail(0, 0, "a string longer than " + std::to_string(kMaxStringBytes) + " bytes");
  out += more;
}

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
  int depth = 0;  // 1 + the deepest list or mapping inside (0: a scalar); at most kMaxValueDepth

  static Value none() { Value v; v.t = T::none; return v; }
  static Value boolean(bool x) { Value v; v.t = T::boolean; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.t = T::integer; v.i = x; return v; }
  static Value number(double x) { Value v; v.t = T::number; v.d = x; return v; }
  static Value string(std::string x) {
    if (x.size() > kMaxStringBytes) fail(0, 0, "a string longer than " + std::to_string(kMaxStringBytes) + " bytes");
    Value v; v.t = T::string; v.s = std::move(x); return v;
  }
  static Value array(Array x = {}) {
    if (x.size() > kMaxListItems) fail(0, 0, "a list of more than " + std::to_string(kMaxListItems) + " items");
    Value v; v.t = T::array;
    for (const auto& e : x) v.deepen(e);
    v.a = std::make_shared<Array>(std::move(x));
    return v;
  }
  static Value object(Object x = {}) {
    Value v; v.t = T::object;
    for (const auto& [k, e] : x) v.deepen(e);
    v.o = std::make_shared<Object>(std::move(x));
    return v;
  }
  // This list or mapping now holds `inner`.
  void deepen(const Value& inner) {
    depth = std::max(depth, inner.depth + 1);
    if (depth > kMaxValueDepth) fail(0, 0, "lists or mappings nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
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
    deepen(v);
    for (auto& [k, old] : *o)
      if (k == key) { old = std::move(v); return; }
    o->emplace_back(key, std::move(v));
  }
};

using T = Value::T;

Value from_json(const nlohmann::ordered_json& j, int depth = 0);  // deeper than kMaxValueDepth: an error
// Whether v is, or holds somewhere inside, a namespace() (which must not end up inside one: a cycle).
bool holds_namespace(const Value& v);
bool truthy(const Value& v);
bool equal(const Value& x, const Value& y);
bool is_space(char c);  // Python's str.isspace() on one ASCII character
std::vector<std::string> utf8_chars(const std::string& s);  // at most kMaxListItems, else an error
size_t utf8_length(const std::string& s);                   // utf8_chars(s).size()
const char* type_name(const Value& v);

// A backslash escape: the character and the letter written after the backslash.
struct Escape {
  char raw, code;
};
char escape_code(std::span<const Escape> table, char raw);   // 0 when raw has none in table
char unescape_code(std::span<const Escape> table, char code);  // 0 when code is none of table's

// Python's repr(float): the shortest digits that read back to the same double.
std::string float_repr(double d);
std::string py_repr_string(const std::string& s);
std::string py_str(const Value& v, bool repr = false);  // str(v), or repr(v)

struct JsonStyle {
  int indent = -1;  // -1: on one line
  std::string item_sep = ", ", key_sep = ": ";
  bool ensure_ascii = false, sort_keys = false;
};
// Python's json.dumps.
void dump_json(const Value& v, const JsonStyle& st, int depth, std::string& out);

}  // namespace troupe::policy::io::jinja
