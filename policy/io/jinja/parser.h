// The chat-template parser (jinja/parser.cpp): recursive descent over lex()'s pieces to the syntax
// tree of ast.h, with jinja2's operator precedence.
// Invariant: unsupported syntax, filters and tests fail at parse time (TemplateError with position).
#pragma once

#include <string_view>

#include "ast.h"

namespace troupe::policy::io::jinja {

// The template's top-level statements.
Body parse_template(std::string_view source);

}  // namespace troupe::policy::io::jinja
