// The chat templates' built-ins other than filters (jinja/builtins.cpp): value access (attributes,
// items, iteration, length), Python's str and dict methods, `is` tests and the global functions
// (raise_exception, namespace, dict, range, strftime_now). The renderer and the filters share them.
// Invariant: errors are TemplateError at the expression `e` (or without position from a global).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ast.h"

namespace troupe::policy::io::jinja {

// v.name (undefined when absent); an error on an undefined v.
Value get_attr(const Value& v, const std::string& name, const Expr& e);
// v[key] for mappings, lists and strings (negative indexes from the end; undefined when absent).
Value get_item(const Value& v, const Value& key, const Expr& e);
// A dotted path of attributes and integer items ("a.0.b"), as jinja2's attribute= arguments.
Value attribute_path(const Value& v, const Value& path, const Expr& e);
// What `for` walks: a list's items, a mapping's keys, a string's characters; nothing for undefined.
std::vector<Value> iterate(const Value& v, const Expr& where);
size_t length(const Value& v, const Expr& e);

// Keyword argument `name`, or null.
const Value* kwarg(const Kwargs& kw, const std::string& name);
// Positional argument `pos` or keyword `name`, else undefined.
Value arg(const Args& a, const Kwargs& kw, size_t pos, const std::string& name);

// s without the characters of `chars` (a string; else whitespace) at its start and/or end.
std::string strip(const std::string& s, const Value& chars, bool start, bool end);
// upper, lower, capitalize or title of str(v).
Value change_case(const std::string& name, const Value& v);
// s with `from` replaced by `to`, at most `count` times (an integer; else every time).
Value replace(const std::string& s, const Value& from, const Value& to, const Value& count, const Expr& e);

// self.name(args) for a string or a mapping (not a namespace).
Value call_method(const Value& self, const std::string& name, const Args& a, const Kwargs& kw, const Expr& e);

bool is_test(const std::string& name);
// `v is name(args)`.
bool apply_test(const std::string& name, const Value& v, const Args& a, const Kwargs& kw, const Expr& e);

// The template's global functions.
Object make_globals();

}  // namespace troupe::policy::io::jinja
