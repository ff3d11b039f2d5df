// envs.math_verify: each rule of the math verifier, and its verdicts on the committed corpus
// (tests/envs/math_corpus.jsonl) against the real math-verify's: agreement >= 98%, and the pairs
// that disagree are exactly those listed in tests/envs/math_verify_disagreements.jsonl (the Python
// SDK's test checks the same, so the C++ and Python verifiers agree on every pair).
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "troupe/envs/env.h"
#include "troupe/envs/math_equal.h"

using namespace troupe::envs;

namespace {

std::vector<json> read_jsonl(const std::string& name) {
  std::ifstream in(std::string(TROUPE_TEST_SOURCE_DIR) + "/tests/envs/" + name);
  EXPECT_TRUE(in) << name;
  std::vector<json> rows;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(json::parse(line));
  return rows;
}

TEST(MathVerify, Numbers) {
  EXPECT_TRUE(math_equal("14", "14"));
  EXPECT_TRUE(math_equal("1,234", "1234"));
  EXPECT_TRUE(math_equal("1{,}234", "1234"));
  EXPECT_TRUE(math_equal("$18", "18"));
  EXPECT_TRUE(math_equal("\\$18.00", "18"));
  EXPECT_TRUE(math_equal("12.", "12"));
  EXPECT_TRUE(math_equal("-3", "-3.0"));
  EXPECT_FALSE(math_equal("-3", "3"));
  EXPECT_FALSE(math_equal("1001", "1000"));
  EXPECT_FALSE(math_equal("", "0"));
  EXPECT_FALSE(math_equal("0", ""));
  EXPECT_TRUE(math_equal("123456789012345678901234567890", "123456789012345678901234567890"));
}

TEST(MathVerify, FractionsAndDecimals) {
  EXPECT_TRUE(math_equal("\\frac{1}{2}", "0.5"));
  EXPECT_TRUE(math_equal("\\dfrac{3}{4}", "3/4"));
  EXPECT_TRUE(math_equal("\\frac34", "0.75"));
  EXPECT_TRUE(math_equal("\\tfrac{6}{8}", "\\frac{3}{4}"));
  EXPECT_TRUE(math_equal("0.333333", "\\frac{1}{3}"));   // decimals: rounded to 6 places
  EXPECT_FALSE(math_equal("0.333", "\\frac{1}{3}"));
  EXPECT_FALSE(math_equal("\\frac{1}{3}", "0.33"));
  EXPECT_FALSE(math_equal("\\frac{2}{3}", "\\frac{3}{2}"));
  EXPECT_FALSE(math_equal("\\frac{1}{0}", "1"));        // not a number: strings decide
}

TEST(MathVerify, Percentages) {
  EXPECT_TRUE(math_equal("50%", "50"));
  EXPECT_TRUE(math_equal("50\\%", "0.5"));
  EXPECT_TRUE(math_equal("\\frac{1}{4}", "25\\%"));
  EXPECT_TRUE(math_equal("12.5\\%", "0.125"));
  EXPECT_FALSE(math_equal("10\\%", "0.01"));
}

TEST(MathVerify, LatexRootsAndExpressions) {
  EXPECT_TRUE(math_equal("\\boxed{\\frac{1}{2}}", "\\frac12"));
  EXPECT_TRUE(math_equal("\\sqrt{8}", "2\\sqrt{2}"));
  EXPECT_TRUE(math_equal("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"));
  EXPECT_TRUE(math_equal("\\sqrt[3]{27}", "3"));
  EXPECT_FALSE(math_equal("1.41", "\\sqrt{2}"));
  EXPECT_TRUE(math_equal("1.414214", "\\sqrt{2}"));
  EXPECT_TRUE(math_equal("\\frac{\\pi}{2}", "\\frac12\\pi"));
  EXPECT_FALSE(math_equal("\\pi", "3.14"));
  EXPECT_TRUE(math_equal("2^{10}", "1024"));
  EXPECT_TRUE(math_equal("(-2)^3", "-8"));
  EXPECT_TRUE(math_equal("2\\cdot 3 + 4 \\times 5", "26"));
  EXPECT_TRUE(math_equal("5!", "120"));
  EXPECT_TRUE(math_equal("\\dbinom{5}{2}", "10"));
  EXPECT_TRUE(math_equal("x^2+2x+1", "(x+1)^2"));      // letters: three fixed points
  EXPECT_FALSE(math_equal("x^2+1", "x^2-1"));
  EXPECT_FALSE(math_equal("2x", "2y"));
  EXPECT_TRUE(math_equal("x = 3", "3"));
  EXPECT_FALSE(math_equal("x = 3", "y = 3"));
  EXPECT_TRUE(math_equal("90^\\circ", "90"));
}

TEST(MathVerify, TextAndUnits) {
  EXPECT_TRUE(math_equal("\\text{(C)}", "C"));
  EXPECT_TRUE(math_equal("5\\text{ cm}", "5"));
  EXPECT_TRUE(math_equal("18 dollars", "18"));
  EXPECT_TRUE(math_equal("12 square feet", "12"));
  EXPECT_FALSE(math_equal("C", "D"));
  EXPECT_TRUE(math_equal("\\text{Monday}", "Monday"));
  EXPECT_FALSE(math_equal("\\text{even}", "\\text{odd}"));
  EXPECT_EQ(math_normalize("\\left( 1,000 , \\$2 \\right)."), "(1000,2)");
}

TEST(MathVerify, SetsTuplesIntervals) {
  EXPECT_TRUE(math_equal("\\{1,2,3\\}", "\\{3, 2, 1\\}"));
  EXPECT_TRUE(math_equal("1, 2, 3", "3,2,1"));
  EXPECT_FALSE(math_equal("\\{1,2\\}", "\\{1,2,3\\}"));
  EXPECT_TRUE(math_equal("\\{0\\}", "0"));
  EXPECT_TRUE(math_equal("(\\frac{1}{2}, 3)", "(0.5, 3)"));
  EXPECT_FALSE(math_equal("(1,2)", "(2,1)"));
  EXPECT_FALSE(math_equal("[1,2]", "(1,2)"));
  EXPECT_FALSE(math_equal("(-\\infty, 3)", "(-\\infty, 3]"));
  EXPECT_TRUE(math_equal("\\left[ 2, 7 \\right]", "[2,7]"));
  EXPECT_TRUE(math_equal("2,3", "(2,3)"));
}

TEST(MathVerify, CorpusAgreesWithMathVerify) {
  auto corpus = read_jsonl("math_corpus.jsonl");
  auto listed = read_jsonl("math_verify_disagreements.jsonl");
  std::set<std::pair<std::string, std::string>> expected;
  for (const auto& d : listed) {
    expected.insert({d["answer"].get<std::string>(), d["reference"].get<std::string>()});
    EXPECT_FALSE(d.value("why", std::string()).empty()) << "every listed disagreement says why";
  }
  ASSERT_GE(corpus.size(), 300u);
  size_t disagree = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto& row = corpus[i];
    const std::string a = row["answer"], r = row["reference"];
    const bool ours = math_equal(a, r);
    const bool differs = ours != row["oracle"].get<bool>();
    disagree += differs;
    EXPECT_EQ(differs, expected.count({a, r}) > 0)
        << "math_corpus.jsonl:" << i + 1 << ": '" << a << "' vs '" << r << "': ours " << ours << ", math-verify "
        << row["oracle"] << (differs ? " (a new disagreement: fix it or list it with why)" : " (listed, but agrees now)");
  }
  EXPECT_EQ(disagree, listed.size());
  EXPECT_GE(1.0 - static_cast<double>(disagree) / static_cast<double>(corpus.size()), 0.98);
}

}  // namespace
