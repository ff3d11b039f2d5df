// Safe arithmetic: a recursive-descent parser over + - * / ( ) and non-negative integer literals,
// evaluated in exact rationals with overflow checks. Used by countdown, the calculator tool and the
// dataset env's numeric verifier. Never evaluates anything but that grammar; input size is capped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::envs {

// p/q in lowest terms, q > 0.
struct Rational {
  int64_t num = 0;
  int64_t den = 1;
  bool operator==(const Rational&) const = default;
  bool is_integer() const { return den == 1; }
  std::string to_string() const;  // "7", "-3/4"
};

struct ExprValue {
  Rational value;
  std::vector<int64_t> literals;  // every integer literal in source order (for countdown's rule)
};

// Grammar: expr := term (('+'|'-') term)*; term := unary (('*'|'/'|'x'|'×'|'÷') unary)*;
//          unary := '-' unary | primary; primary := INT | '(' expr ')'.
// Errors: syntax (with the column), division by zero, overflow, too long (> 512 bytes), too deep.
Result<ExprValue> eval_expression(const std::string& text);

// Parses a number written as an integer, decimal ("2.50") or fraction ("5/2") into a rational.
Result<Rational> parse_number(const std::string& text);

}  // namespace troupe::envs
