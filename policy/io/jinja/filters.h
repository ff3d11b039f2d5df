// The chat templates' filters (jinja/filters.cpp): `value | name(args)`, one small function per
// filter behind a table keyed by name, which is also the list the parser accepts.
// Invariant: a filter sees its subject and arguments evaluated; errors point at the filter expression.
#pragma once

#include <string>

#include "ast.h"

namespace troupe::policy::io::jinja {

bool is_filter(const std::string& name);
// `v | name(a, kw)` (an error for a name is_filter refuses).
Value apply_filter(const std::string& name, const Value& v, const Args& a, const Kwargs& kw, const Expr& e);

}  // namespace troupe::policy::io::jinja
