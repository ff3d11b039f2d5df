// The chat templates' built-ins other than filters (builtins.h): value access, the str and dict
// methods, `is` tests and the global functions, each with jinja2's (and Python's) behaviour.
// Invariant: nothing here evaluates an expression; arguments arrive evaluated.
#include "builtins.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <set>

namespace troupe::policy::io::jinja {

namespace {

const std::set<std::string> kTests = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                      "mapping", "sequence", "iterable", "boolean", "true", "false", "eq",
                                      "equalto", "ne", "odd", "even", "callable", "in", "lower", "upper",
                                      "divisibleby", "gt", "lt", "ge", "le", "sameas"};

int64_t norm_index(int64_t k, size_t n) { return k < 0 ? k + static_cast<int64_t>(n) : k; }

// str.split / str.rsplit (rsplit only without maxsplit, where both split alike).
Value split(const std::string& s, const std::string& name, const Value& sep, const Value& maxv, const Expr& e) {
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

Value string_method(const std::string& s, const std::string& name, const Args& a, const Kwargs& kw, const Expr& e) {
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::string(strip(s, arg(a, kw, 0, "chars"), name != "rstrip", name != "lstrip"));
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
  if (name == "split" || name == "rsplit") return split(s, name, arg(a, kw, 0, "sep"), arg(a, kw, 1, "maxsplit"), e);
  if (name == "upper" || name == "lower") return change_case(name, Value::string(s));
  if (name == "title" || name == "capitalize") return change_case(name, Value::string(s));
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
      append_bounded(out, (first ? "" : s) + py_str(x));
      first = false;
    }
    return Value::string(out);
  }
  err(e, "unsupported string method '" + name + "'");
}

Value mapping_method(const Value& self, const std::string& name, const Args& a, const Kwargs& kw, const Expr& e) {
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

}  // namespace

Value get_attr(const Value& v, const std::string& name, const Expr& e) {
  if (v.t == T::undefined) err(e, "cannot read attribute '" + name + "' of an undefined value");
  if (v.t == T::object)
    if (const Value* x = v.find(name)) return *x;
  return {};
}

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


const Value* kwarg(const Kwargs& kw, const std::string& name) {
  for (auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}
Value arg(const Args& a, const Kwargs& kw, size_t pos, const std::string& name) {
  if (pos < a.size()) return a[pos];
  if (const Value* v = kwarg(kw, name)) return *v;
  return {};
}


std::string strip(const std::string& s, const Value& chars, bool start, bool end) {
  const std::string set = chars.is_str() ? chars.s : std::string(" \t\n\r\v\f");
  size_t b = 0, en = s.size();
  if (start) while (b < en && set.find(s[b]) != std::string::npos) ++b;
  if (end) while (en > b && set.find(s[en - 1]) != std::string::npos) --en;
  return s.substr(b, en - b);
}

Value change_case(const std::string& name, const Value& v) {
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
    append_bounded(out, s.substr(k, f - k) + to.s);
    k = f + from.s.size();
    --left;
  }
  return Value::string(out + s.substr(k));
}


Value call_method(const Value& self, const std::string& name, const Args& a, const Kwargs& kw, const Expr& e) {
  if (self.t == T::string) return string_method(self.s, name, a, kw, e);
  if (self.t == T::object && !self.is_namespace) return mapping_method(self, name, a, kw, e);
  err(e, std::string("unsupported method '") + name + "' on a " + type_name(self));
}

bool is_test(const std::string& name) { return kTests.count(name) > 0; }

bool apply_test(const std::string& name, const Value& v, const Args& a, const Kwargs& kw, const Expr& e) {
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
  if (name == "lower" || name == "upper") return v.is_str() && py_str(change_case(name, v)) == v.s;
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
  if (name == "divisibleby")
    return x.t == T::integer && x.i != 0 && v.t == T::integer && (x.i == -1 || v.i % x.i == 0);
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
    case T::string: return utf8_length(v.s);
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
    if (digits && part.size() > 18) err(e, "attribute path index out of range: " + part.substr(0, 40));
    cur = digits ? get_item(cur, Value::integer(std::stoll(part)), e) : get_attr(cur, part, e);
    if (dot == std::string::npos) break;
    k = dot + 1;
  }
  return cur;
}


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
                   // the length as Python computes it, in unsigned arithmetic that cannot overflow
                   const bool empty = step > 0 ? stop <= start : start <= stop;
                   const uint64_t span = step > 0 ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start)
                                                  : static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
                   const uint64_t mag = step > 0 ? static_cast<uint64_t>(step) : uint64_t{0} - static_cast<uint64_t>(step);
                   const uint64_t len = empty ? 0 : span / mag + (span % mag != 0);
                   if (len > static_cast<uint64_t>(kMaxRange))
                     throw TemplateError{0, 0, "range() of more than " + std::to_string(kMaxRange) + " values"};
                   Array out;
                   for (uint64_t k = 0; k < len; ++k)  // start + k * step stays between start and stop
                     out.push_back(Value::integer(static_cast<int64_t>(static_cast<uint64_t>(start) + k * static_cast<uint64_t>(step))));
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

}  // namespace troupe::policy::io::jinja
