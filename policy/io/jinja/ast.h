// The chat-template syntax tree: expressions and statements as the parser (parser.cpp) builds them
// and the renderer (renderer.cpp) walks them. Node is the type ChatTemplate holds (chat_template.h).
// Invariant: a tree is immutable once parsed (shared, const), and every node keeps its line and column.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "value.h"

namespace troupe::policy::io::jinja {

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

// A TemplateError at the expression's position.
[[noreturn]] inline void err(const Expr& e, const std::string& m) { fail(e.line, e.col, m); }

}  // namespace troupe::policy::io::jinja
