// Values of the chat-template Jinja subset (jinja/*.cpp, chat_template.cpp): JSON-like values with
// Python's semantics where templates rely on them (truthiness, ==, str(), repr(), json.dumps).
// Invariant: errors inside the jinja/ files are thrown as TemplateError (line, column, message);
// only chat_template.cpp's public entry points catch them and turn them into a troupe::Error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::policy::io::jinja {

struct TemplateError {
  int line, col;
  std::string message;
};

[[noreturn]] inline void fail(int line, int col, std::string message) { throw TemplateError{line, col, std::move(message)}; }

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

Value from_json(const nlohmann::ordered_json& j);
bool truthy(const Value& v);
bool equal(const Value& x, const Value& y);
bool is_space(char c);  // Python's str.isspace() on one ASCII character
std::vector<std::string> utf8_chars(const std::string& s);
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
