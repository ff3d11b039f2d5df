// Jinja values (value.h): conversion from JSON, Python's truthiness and ==, and the way Python
// prints values: str(), repr() and json.dumps, byte for byte as transformers' templates see them.
// Invariant: nothing here depends on a template's source; errors are TemplateError without position.
#include "value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace troupe::policy::io::jinja {

namespace {

// What json.dumps and Python's repr() write after a backslash.
constexpr Escape kJsonEscapes[] = {{'"', '"'}, {'\\', '\\'}, {'\n', 'n'}, {'\r', 'r'},
                                   {'\t', 't'}, {'\b', 'b'}, {'\f', 'f'}};
constexpr Escape kReprEscapes[] = {{'\\', '\\'}, {'\n', 'n'}, {'\t', 't'}, {'\r', 'r'}};

std::string json_string(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t k = 0; k < s.size(); ++k) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    if (const char e = escape_code(kJsonEscapes, static_cast<char>(c))) {
      out += '\\';
      out += e;
    } else if (c < 0x20) {
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
  return out + "\"";
}

}  // namespace

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) fail(0, 0, "template variables nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      for (auto& e : j) a.push_back(from_json(e, depth + 1));
      return Value::array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (auto it = j.begin(); it != j.end(); ++it) o.emplace_back(it.key(), from_json(it.value(), depth + 1));
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

namespace {
bool holds_namespace(const Value& v, std::vector<const void*>& seen) {
  if (v.t == T::object && v.is_namespace) return true;
  const void* id = v.t == T::array ? static_cast<const void*>(v.a.get()) : static_cast<const void*>(v.o.get());
  if ((v.t != T::array && v.t != T::object) || std::find(seen.begin(), seen.end(), id) != seen.end()) return false;
  seen.push_back(id);  // shared lists are walked once
  if (v.t == T::array) return std::any_of(v.a->begin(), v.a->end(), [&](const Value& x) { return holds_namespace(x, seen); });
  return std::any_of(v.o->begin(), v.o->end(), [&](const auto& kv) { return holds_namespace(kv.second, seen); });
}
}  // namespace

bool holds_namespace(const Value& v) {
  std::vector<const void*> seen;
  return holds_namespace(v, seen);
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
      if (x.a == y.a) return true;
      if (x.a->size() != y.a->size()) return false;
      for (size_t k = 0; k < x.a->size(); ++k)
        if (!equal((*x.a)[k], (*y.a)[k])) return false;
      return true;
    case T::object:
      if (x.o == y.o) return true;
      if (x.o->size() != y.o->size()) return false;
      for (auto& [k, v] : *x.o) {
        const Value* w = y.find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    default: return x.f == y.f;
  }
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

char escape_code(std::span<const Escape> table, char raw) {
  for (const Escape& e : table)
    if (e.raw == raw) return e.code;
  return 0;
}

char unescape_code(std::span<const Escape> table, char code) {
  for (const Escape& e : table)
    if (e.code == code) return e.raw;
  return 0;
}

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

// Python's json.dumps.
void dump_json(const Value& v, const JsonStyle& st, int depth, std::string& out) {
  auto newline = [&](int d) {
    out += '\n';
    append_bounded(out, std::string(std::min<size_t>(static_cast<size_t>(st.indent) * static_cast<size_t>(d), kMaxStringBytes + 1), ' '));
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
        if (out.size() > kMaxStringBytes) append_bounded(out, "]");  // shared lists can nest exponentially
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
    const char e = c == q ? q : escape_code(kReprEscapes, c);
    if (e) out += '\\', out += e;
    else out += c;
  }
  return out + q;
}

std::string py_str(const Value& v, bool repr) {
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
      for (size_t k = 0; k < v.a->size(); ++k) append_bounded(out, (k ? ", " : "") + py_str((*v.a)[k], true));
      return out + "]";
    }
    case T::object: {
      if (v.is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (auto& [k, x] : *v.o) {
        append_bounded(out, (first ? "" : ", ") + py_repr_string(k) + ": " + py_str(x, true));
        first = false;
      }
      return out + "}";
    }
  }
  return "";
}

namespace {
size_t utf8_width(unsigned char lead) { return lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1; }
}  // namespace

std::vector<std::string> utf8_chars(const std::string& s) {
  if (utf8_length(s) > kMaxListItems)
    fail(0, 0, "a string of more than " + std::to_string(kMaxListItems) + " characters taken apart");
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    const size_t n = utf8_width(static_cast<unsigned char>(s[k]));
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (size_t k = 0; k < s.size(); k += utf8_width(static_cast<unsigned char>(s[k]))) ++n;
  return n;
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

}  // namespace troupe::policy::io::jinja
