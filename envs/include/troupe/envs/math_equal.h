// The `math` verifier: is a model's answer mathematically the reference answer? Rules (numbers,
// fractions, decimals, percentages, LaTeX, simple expressions, sets, tuples, units) are listed in
// docs/answers.md; the Python SDK's troupe_env.answers.math_equal gives the same verdict on every input.
#pragma once

#include <string>

namespace troupe::envs {

// Both sides normalised and compared: exact rationals where the arithmetic stays exact, a decimal
// written with a point compared rounded to 6 decimals, other real values with relative tolerance
// 1e-9, expressions in letters at three fixed points; otherwise normalised strings must be equal.
bool math_equal(const std::string& answer, const std::string& reference);

// The normal form both sides are compared in (exposed for tests): \boxed contents, no $, \left,
// \right, spacing commands, \text{} wrappers, trailing unit words, thousands separators, spaces or
// a trailing '.'; \dfrac and \tfrac written \frac, \cdot and \times written '*', \% written '%'.
std::string math_normalize(const std::string& text);

}  // namespace troupe::envs
