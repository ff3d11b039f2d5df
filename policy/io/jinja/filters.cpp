// The chat templates' filters (filters.h) with jinja2's behaviour, one function per filter (or per
// family of filters that share their code) and the table that names them.
// Invariant: the table holds exactly the filters the parser accepts; names it lists but troupe does
// not implement (sort, dictsort, min, max, e, escape) fail with "unsupported filter" when applied.
#include "filters.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string_view>

#include "builtins.h"

namespace troupe::policy::io::jinja {

namespace {

// One filter application: `v | name(a, kw)` at expression e.
struct Call {
  const std::string& name;
  const Value& v;
  const Args& a;
  const Kwargs& kw;
  const Expr& e;
};
using Filter = Value (*)(const Call&);

Value safe(const Call& c) {
  if (c.name != "safe") err(c.e, "unsupported filter '" + c.name + "' (HTML escaping)");
  return c.v;
}

Value trim(const Call& c) { return Value::string(strip(py_str(c.v), arg(c.a, c.kw, 0, "chars"), true, true)); }

Value length_of(const Call& c) { return Value::integer(static_cast<int64_t>(length(c.v, c.e))); }

Value to_string(const Call& c) { return Value::string(py_str(c.v)); }

Value case_of(const Call& c) { return change_case(c.name, c.v); }

Value replace_in(const Call& c) {
  return replace(py_str(c.v), arg(c.a, c.kw, 0, "old"), arg(c.a, c.kw, 1, "new"), arg(c.a, c.kw, 2, "count"), c.e);
}

Value tojson(const Call& c) {
  JsonStyle st;
  Value indent = arg(c.a, c.kw, 1000, "indent");
  // Python writes ' ' * indent: none for a negative one; past 1000 it is refused here
  auto width = [&](int64_t w) {
    if (w > 1000) err(c.e, "tojson: indent " + std::to_string(w) + " is over 1000");
    return static_cast<int>(std::max<int64_t>(w, 0));
  };
  if (indent.t == T::integer) st.indent = width(indent.i), st.item_sep = ",";
  if (!c.a.empty() && c.a[0].t == T::integer) st.indent = width(c.a[0].i), st.item_sep = ",";
  if (const Value* x = kwarg(c.kw, "ensure_ascii")) st.ensure_ascii = truthy(*x);
  if (const Value* x = kwarg(c.kw, "sort_keys")) st.sort_keys = truthy(*x);
  if (const Value* x = kwarg(c.kw, "separators"); x && x->t == T::array && x->a->size() == 2)
    st.item_sep = py_str((*x->a)[0]), st.key_sep = py_str((*x->a)[1]);
  std::string out;
  try {
    dump_json(c.v, st, 0, out);
  } catch (TemplateError&) {
    err(c.e, "tojson: a function is not JSON");
  }
  return Value::string(out);
}

Value join(const Call& c) {
  Value sep = arg(c.a, c.kw, 0, "d");
  Value attr = arg(c.a, c.kw, 1, "attribute");
  std::string out;
  bool first = true;
  for (auto& x : iterate(c.v, c.e)) {
    append_bounded(out, (first ? "" : py_str(sep)) + py_str(attr.defined() ? attribute_path(x, attr, c.e) : x));
    first = false;
  }
  return Value::string(out);
}

Value default_value(const Call& c) {
  Value dflt = arg(c.a, c.kw, 0, "default_value");
  bool boolean = truthy(arg(c.a, c.kw, 1, "boolean"));
  if (!c.v.defined() || (boolean && !truthy(c.v))) return dflt.defined() ? dflt : Value::string("");
  return c.v;
}

Value items(const Call& c) {
  if (c.v.t == T::undefined) return Value::array();
  if (c.v.t != T::object) err(c.e, "items needs a mapping");
  return call_method(c.v, "items", {}, {}, c.e);
}

Value list(const Call& c) { return Value::array(iterate(c.v, c.e)); }

Value first_or_last(const Call& c) {
  auto items = iterate(c.v, c.e);
  if (items.empty()) return {};
  return c.name == "first" ? items.front() : items.back();
}

Value reverse(const Call& c) {
  if (c.v.is_str()) {
    auto cs = utf8_chars(c.v.s);
    std::string out;
    for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
    return Value::string(out);
  }
  auto items = iterate(c.v, c.e);
  std::reverse(items.begin(), items.end());
  return Value::array(std::move(items));
}

Value to_int(const Call& c) {
  const Value& v = c.v;
  if (v.t == T::integer) return v;
  if (v.t == T::number) {
    if (!(v.d > -9.2e18 && v.d < 9.2e18)) err(c.e, "int() of " + py_str(v) + ": out of range");
    return Value::integer(static_cast<int64_t>(v.d));
  }
  if (v.is_str()) {
    try {
      return Value::integer(std::stoll(v.s));
    } catch (...) {
    }
  }
  Value d = arg(c.a, c.kw, 0, "default");
  return d.defined() ? d : Value::integer(0);
}

Value to_float(const Call& c) {
  if (c.v.is_num()) return Value::number(c.v.as_double());
  if (c.v.is_str()) {
    try {
      return Value::number(std::stod(c.v.s));
    } catch (...) {
    }
  }
  return Value::number(0);
}

Value abs_of(const Call& c) {
  if (!c.v.is_num()) err(c.e, "abs needs a number");
  return c.v.t == T::integer ? Value::integer(c.v.i < 0 ? -c.v.i : c.v.i) : Value::number(std::fabs(c.v.d));
}

// select, reject (the items themselves), selectattr, rejectattr (an attribute of each): items whose
// test (a test name and its arguments, else truthiness) passes, or fails.
Value select(const Call& c) {
  const std::string& f = c.name;
  bool by_attr = f == "selectattr" || f == "rejectattr";
  bool keep = f == "selectattr" || f == "select";
  size_t t = by_attr ? 1 : 0;
  Array out;
  for (auto& x : iterate(c.v, c.e)) {
    Value subject = by_attr ? attribute_path(x, c.a.empty() ? Value{} : c.a[0], c.e) : x;
    bool r;
    if (c.a.size() > t) {
      std::string test_name = py_str(c.a[t]);
      if (!is_test(test_name)) err(c.e, "unsupported test '" + test_name + "' in " + f);
      r = apply_test(test_name, subject, Args(c.a.begin() + static_cast<std::ptrdiff_t>(t + 1), c.a.end()), {}, c.e);
    } else {
      r = truthy(subject);
    }
    if (r == keep) out.push_back(x);
  }
  return Value::array(std::move(out));
}

Value map(const Call& c) {
  Array out;
  const Value* attr = kwarg(c.kw, "attribute");
  Value dflt = kwarg(c.kw, "default") ? *kwarg(c.kw, "default") : Value{};
  if (!attr && (c.a.empty() || !c.a[0].is_str())) err(c.e, "map needs attribute= or a filter name");
  std::string fname = attr ? "" : c.a[0].s;
  if (!attr && fname != "string" && fname != "trim" && fname != "lower" && fname != "upper" && fname != "length" &&
      fname != "tojson" && fname != "int" && fname != "first" && fname != "last")
    err(c.e, "unsupported: map('" + fname + "')");
  for (auto& x : iterate(c.v, c.e)) {
    if (attr) {
      Value y = attribute_path(x, *attr, c.e);
      out.push_back(y.defined() || !dflt.defined() ? y : dflt);
      continue;
    }
    out.push_back(apply_filter(fname, x, {}, {}, c.e));
  }
  return Value::array(std::move(out));
}

Value indent(const Call& c) {
  Value w = arg(c.a, c.kw, 0, "width");
  const int64_t n = w.t == T::integer ? w.i : 4;
  if (!w.is_str() && n > 1000) err(c.e, "indent: width " + std::to_string(n) + " is over 1000");
  std::string pad = w.is_str() ? w.s : std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
  bool first = truthy(arg(c.a, c.kw, 1, "first")), blank = truthy(arg(c.a, c.kw, 2, "blank"));
  std::string s = py_str(c.v), out;
  size_t k = 0;
  bool line0 = true;
  while (k <= s.size()) {
    size_t nl = s.find('\n', k);
    std::string line = s.substr(k, nl == std::string::npos ? std::string::npos : nl - k);
    if ((!line0 || first) && (blank || !line.empty())) append_bounded(out, pad);
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    k = nl + 1;
    line0 = false;
  }
  return Value::string(out);
}

Value wordcount(const Call& c) {
  Value sp = call_method(Value::string(py_str(c.v)), "split", {}, {}, c.e);
  return Value::integer(static_cast<int64_t>(sp.a->size()));
}

Value unique(const Call& c) {
  Array out;
  for (auto& x : iterate(c.v, c.e))
    if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
  return Value::array(std::move(out));
}

Value sum(const Call& c) {
  Value acc = Value::integer(0);
  for (auto& x : iterate(c.v, c.e)) {
    if (!x.is_num()) err(c.e, "sum needs numbers");
    acc = acc.t == T::integer && x.t == T::integer ? Value::integer(acc.i + x.i)
                                                    : Value::number(acc.as_double() + x.as_double());
  }
  return acc;
}

// sort, dictsort, min, max: accepted by the parser, refused here (after the subject is iterated).
Value unsupported(const Call& c) {
  (void)iterate(c.v, c.e);
  err(c.e, "unsupported filter '" + c.name + "'");
}

const std::map<std::string_view, Filter>& filters() {
  static const std::map<std::string_view, Filter> table = {
      {"safe", safe},        {"e", safe},           {"escape", safe},          {"trim", trim},
      {"length", length_of}, {"count", length_of},  {"string", to_string},     {"upper", case_of},
      {"lower", case_of},    {"capitalize", case_of}, {"title", case_of},      {"replace", replace_in},
      {"tojson", tojson},    {"join", join},        {"default", default_value}, {"d", default_value},
      {"items", items},      {"list", list},        {"first", first_or_last},  {"last", first_or_last},
      {"reverse", reverse},  {"int", to_int},       {"float", to_float},       {"abs", abs_of},
      {"select", select},    {"reject", select},    {"selectattr", select},    {"rejectattr", select},
      {"map", map},          {"indent", indent},    {"wordcount", wordcount},  {"unique", unique},
      {"sum", sum},          {"sort", unsupported}, {"dictsort", unsupported}, {"min", unsupported},
      {"max", unsupported}};
  return table;
}

}  // namespace

bool is_filter(const std::string& name) { return filters().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& v, const Args& a, const Kwargs& kw, const Expr& e) {
  const auto it = filters().find(name);
  if (it == filters().end()) err(e, "unsupported filter '" + name + "'");
  return it->second(Call{name, v, a, kw, e});
}

}  // namespace troupe::policy::io::jinja
