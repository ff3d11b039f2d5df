// envs.expr: the safe rational parser that countdown, calculator and numeric verification trust.
#include "troupe/envs/expr.h"

#include <gtest/gtest.h>

using namespace troupe::envs;

TEST(Expr, PrecedenceAndParentheses) {
  EXPECT_EQ(eval_expression("2+3*4")->value, (Rational{14, 1}));
  EXPECT_EQ(eval_expression("(2+3)*4")->value, (Rational{20, 1}));
  EXPECT_EQ(eval_expression("10-4-3")->value, (Rational{3, 1}));
  EXPECT_EQ(eval_expression(" 7 / 2 ")->value, (Rational{7, 2}));
  EXPECT_EQ(eval_expression("-3 + 5")->value, (Rational{2, 1}));
  EXPECT_EQ(eval_expression("6 × 7 ÷ 3")->value, (Rational{14, 1}));
  EXPECT_EQ(eval_expression("(1/3)*3")->value, (Rational{1, 1}));
}

TEST(Expr, LiteralsInOrder) {
  auto v = eval_expression("(25 - 5) * 3 + 1");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->literals, (std::vector<int64_t>{25, 5, 3, 1}));
}

TEST(Expr, RejectsWithoutCrashing) {
  for (const char* bad : {"", "1+", "(1+2", "1+2)", "2**3", "__import__('os')", "1e5", "abc", "1/0", "5/(3-3)",
                          "99999999999999999999", "9223372036854775807*9223372036854775807"}) {
    auto v = eval_expression(bad);
    EXPECT_FALSE(v.ok()) << bad;
    if (!v.ok()) {
      EXPECT_FALSE(v.error().message.empty());
    }
  }
  EXPECT_FALSE(eval_expression(std::string(600, '1')).ok());
  EXPECT_FALSE(eval_expression(std::string(200, '(') + "1" + std::string(200, ')')).ok());
  auto col = eval_expression("1 + $");
  ASSERT_FALSE(col.ok());
  EXPECT_NE(col.error().message.find("column 5"), std::string::npos) << col.error().message;
}

TEST(Expr, ParseNumber) {
  EXPECT_EQ(*parse_number("0.5"), (Rational{1, 2}));
  EXPECT_EQ(*parse_number("1/2"), (Rational{1, 2}));
  EXPECT_EQ(*parse_number("2.50"), (Rational{5, 2}));
  EXPECT_EQ(*parse_number("-1,000"), (Rational{-1000, 1}));
  EXPECT_FALSE(parse_number("1/0").ok());
  EXPECT_FALSE(parse_number("abc").ok());
  EXPECT_FALSE(parse_number("").ok());
  EXPECT_FALSE(parse_number("1.2.3").ok());
}
