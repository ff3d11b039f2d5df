// The chat-template renderer (jinja/renderer.cpp): evaluates a parsed template (ast.h) with the
// built-in globals, filters and tests.
// Invariant: a render reads the tree only, so one parsed template renders from any thread.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "ast.h"

namespace troupe::policy::io::jinja {

// The template's output with `variables` (an object) as its context.
std::string render_template(const Body& body, const nlohmann::ordered_json& variables);

}  // namespace troupe::policy::io::jinja
