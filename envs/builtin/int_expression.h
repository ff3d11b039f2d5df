// Private helper of arithmetic and calculator: the shape of their generated integer expressions
// (`digits` per number, `terms` numbers, operators drawn from `ops`), read from the env's config,
// drawn in the requested split and evaluated exactly.
#pragma once

#include <string>

#include "src/config_util.h"
#include "troupe/envs/expr.h"

namespace troupe::envs::detail {

struct DrawnExpression {
  std::string text;    // e.g. "12+7*30"
  std::string answer;  // its exact value, e.g. "222"
};

struct IntExpression {
  int digits = 1, terms = 2;
  std::string ops = "+";
  bool full_width = false;  // every number has exactly `digits` digits (else 0 .. 10^digits - 1)

  // Reads digits (1..9), terms (1..8, default 2) and ops, with the env's defaults.
  Status read(ConfigReader& r, int64_t default_digits, const std::string& default_ops) {
    TROUPE_ASSIGN_OR_RETURN(int64_t d, r.integer("digits", default_digits, 1, 9));
    TROUPE_ASSIGN_OR_RETURN(int64_t t, r.integer("terms", 2, 1, 8));
    TROUPE_ASSIGN_OR_RETURN(ops, r.string("ops", default_ops));
    digits = static_cast<int>(d);
    terms = static_cast<int>(t);
    return {};
  }
  // ops must be a non-empty string of + - * (checked after the reader's finish()).
  Status check(const std::string& where) const {
    if (ops.empty() || ops.find_first_not_of("+-*") != std::string::npos)
      return invalid_input(where + ": 'ops' must be a non-empty string of + - * (got '" + ops + "')");
    return {};
  }
  // One expression, e.g. "12+7*30": for each term an operator (after the first), then a number.
  std::string draw(SplitMix& rng) const {
    int64_t hi = 1;
    for (int i = 0; i < digits; ++i) hi *= 10;
    std::string expr;
    for (int t = 0; t < terms; ++t) {
      if (t > 0) expr += ops[static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(ops.size()) - 1))];
      expr += std::to_string(rng.uniform(full_width ? hi / 10 : 0, hi - 1));
    }
    return expr;
  }
  // The instance of `seed` in `split` (draw_in_split over draw()), with its value.
  Result<DrawnExpression> draw_in(uint64_t seed, Split split, int eval_permille,
                                  const std::string& env) const {
    DrawnExpression e;
    TROUPE_TRY(draw_in_split(seed, split, eval_permille, env, [&](SplitMix& rng) {
      e.text = draw(rng);
      return e.text;
    }));
    TROUPE_ASSIGN_OR_RETURN(ExprValue value, eval_expression(e.text));
    e.answer = value.value.to_string();
    return e;
  }
};

}  // namespace troupe::envs::detail
