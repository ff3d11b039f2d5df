// envs.answer_extract: every extraction rule on the cases the Python SDK is also tested on
// (tests/envs/extract_cases.jsonl), pattern errors at config time, and the dataset env reading raw
// GSM8K rows (reference extraction at load, FILE:LINE errors, scoring a chain of thought).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "troupe/envs/answer_extract.h"
#include "troupe/envs/registry.h"

using namespace troupe::envs;

namespace {

std::string write_file(const std::string& name, const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / ("troupe_answer_extract_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path) << text;
  return path.string();
}

std::optional<std::string> run(ExtractHow how, const std::string& text, const std::string& pattern = "") {
  auto e = make_answer_extractor(how, pattern);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  return extract_answer_with(*e, text);
}

TEST(AnswerExtract, SharedCasesAgreeWithThePythonSdk) {
  std::ifstream in(std::string(TROUPE_TEST_SOURCE_DIR) + "/tests/envs/extract_cases.jsonl");
  ASSERT_TRUE(in);
  std::string line;
  int n = 0;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    json c = json::parse(line);
    auto how = troupe::enum_from_name<ExtractHow>(c["how"].get<std::string>());
    ASSERT_TRUE(how) << "extract_cases.jsonl:" << lineno;
    auto got = run(*how, c["text"].get<std::string>(), c.value("pattern", std::string()));
    if (c["expected"].is_null()) {
      EXPECT_FALSE(got) << "extract_cases.jsonl:" << lineno << " gave '" << got.value_or("") << "'";
    } else {
      EXPECT_EQ(got.value_or("<none>"), c["expected"].get<std::string>()) << "extract_cases.jsonl:" << lineno;
    }
    ++n;
  }
  EXPECT_GE(n, 30);
}

TEST(AnswerExtract, EachRule) {
  EXPECT_EQ(run(ExtractHow::answer_tag, "think\n<answer>42</answer>"), "42");
  EXPECT_EQ(run(ExtractHow::answer_tag, "42\nmore"), "42");
  EXPECT_EQ(run(ExtractHow::last_number, "3 apples and 1,000,000 pears."), "1000000");
  EXPECT_EQ(run(ExtractHow::boxed, "\\boxed{\\frac{a}{\\sqrt{b}}}"), "\\frac{a}{\\sqrt{b}}");
  EXPECT_EQ(run(ExtractHow::gsm8k, "Natalia sold 48/2 = 24 clips.\n#### 72"), "72");
  EXPECT_EQ(run(ExtractHow::regex, "Final: 9. Final: 10.", "Final: (\\d+)"), "10");
  EXPECT_EQ(last_boxed("\\boxed{ 5 }"), " 5 ");
  EXPECT_FALSE(last_boxed("\\boxed"));
}

TEST(AnswerExtract, PatternErrors) {
  auto none = make_answer_extractor(ExtractHow::regex, "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("needs 'pattern'"), std::string::npos);
  auto bad = make_answer_extractor(ExtractHow::regex, "Answer: (\\d+");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not a valid regex"), std::string::npos);
  auto no_group = make_answer_extractor(ExtractHow::regex, "Answer: \\d+");
  ASSERT_FALSE(no_group.ok());
  EXPECT_NE(no_group.error().message.find("no capture group"), std::string::npos);
  auto stray = make_answer_extractor(ExtractHow::boxed, "(x)");
  ASSERT_FALSE(stray.ok());
  EXPECT_NE(stray.error().message.find("only read with extract: regex"), std::string::npos);
  for (auto how : {ExtractHow::answer_tag, ExtractHow::last_number, ExtractHow::boxed, ExtractHow::gsm8k, ExtractHow::regex})
    EXPECT_EQ(troupe::enum_from_name<ExtractHow>(troupe::enum_name(how)), how);
}

TEST(AnswerExtract, ReferenceAnswerAndCompletion) {
  auto gsm = *make_answer_extractor(ExtractHow::gsm8k, "");
  EXPECT_EQ(*extract_reference_answer(gsm, "7+7=14\n#### 14"), "14");
  auto missing = extract_reference_answer(gsm, "He has 14");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no '####'"), std::string::npos);
  EXPECT_NE(missing.error().message.find("extract_reference: false"), std::string::npos);
  EXPECT_EQ(reference_completion_for(gsm, "7+7=14\n#### 14", "14"), "7+7=14\n#### 14");
  EXPECT_EQ(reference_completion_for(gsm, "14", "14"), "#### 14");
  auto boxed = *make_answer_extractor(ExtractHow::boxed, "");
  EXPECT_EQ(reference_completion_for(boxed, "1/2", "1/2"), "\\boxed{1/2}");
  AnswerExtractor tag;
  EXPECT_EQ(*extract_reference_answer(tag, " 7 "), " 7 ");  // as before: the reference as it is
  EXPECT_EQ(reference_completion_for(tag, " 7 ", " 7 "), "<answer> 7 </answer>");
}

// Raw GSM8K rows: the reference after '####', a chain of thought scored on its final answer.
TEST(DatasetExtract, RawGsm8kRows) {
  const std::string rows =
      R"({"question": "Tom has 7 apples and gets 7 more. How many?", "answer": "He has 7+7=14.\n#### 14"})" "\n"
      R"({"question": "A pen costs $1,200 / 100. Price?", "answer": "1,200/100 = 12\n#### 12"})" "\n";
  auto path = write_file("gsm8k.jsonl", rows);
  auto made = EnvRegistry::global().create(
      "dataset", {{"train", path}, {"eval", path + ".none"}, {"extract", "gsm8k"}, {"verifier", "math"}});
  ASSERT_FALSE(made.ok());  // the eval file does not exist: a clear error, not a crash
  made = EnvRegistry::global().create("dataset", {{"train", path}, {"extract", "gsm8k"}, {"verifier", "math"},
                                                  {"eval_fraction", 0.0}, {"format_reward", 0.25}});
  ASSERT_TRUE(made.ok()) << made.error().message;
  auto& env = **made;
  auto obs = env.reset(0, {});
  ASSERT_TRUE(obs.ok());
  EXPECT_EQ(obs->metadata["answer"], "14");
  EXPECT_EQ(obs->metadata["reference_completion"], "He has 7+7=14.\n#### 14");
  EXPECT_EQ(env.verify(obs->metadata, "Tom has 7 and 7 more, 7+7 = 14 apples.\n#### 14")->reward, 1.0);
  EXPECT_EQ(env.verify(obs->metadata, "#### 14.0")->reward, 1.0);
  EXPECT_EQ(env.verify(obs->metadata, "#### 15")->reward, 0.25);  // well formed, wrong
  EXPECT_EQ(env.verify(obs->metadata, "14")->reward, 0.0);        // no ####: nothing extracted
  EXPECT_EQ(env.verify(obs->metadata, obs->metadata["reference_completion"].get<std::string>())->reward, 1.0);
  // The numeric verifier's load check runs on the extracted reference.
  auto numeric = EnvRegistry::global().create("dataset", {{"train", path}, {"extract", "gsm8k"}, {"verifier", "numeric"}});
  EXPECT_TRUE(numeric.ok()) << numeric.error().message;
  auto old = EnvRegistry::global().create("dataset", {{"train", path}, {"verifier", "numeric"}});
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.error().message.find("is not a number"), std::string::npos);
}

TEST(DatasetExtract, ReferenceWithoutAnswerNamesFileLine) {
  auto path = write_file("bad.jsonl", R"({"question": "q1", "answer": "x\n#### 3"})" "\n"
                                      R"({"question": "q2", "answer": "no marker here"})" "\n");
  auto made = EnvRegistry::global().create("dataset", {{"train", path}, {"extract", "gsm8k"}, {"verifier", "math"}});
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.error().message.find(path + ":2: error: reference 'no marker here' has no '####'"), std::string::npos)
      << made.error().message;
  // extract_reference: false reads the field as the answer itself.
  auto clean = write_file("clean.jsonl", R"({"question": "q1", "answer": "\\frac{1}{2}"})" "\n");
  auto boxed = EnvRegistry::global().create(
      "dataset", {{"train", clean}, {"extract", "boxed"}, {"extract_reference", false}, {"verifier", "math"}, {"eval_fraction", 0.0}});
  ASSERT_TRUE(boxed.ok()) << boxed.error().message;
  auto obs = (*boxed)->reset(0, {});
  EXPECT_EQ(obs->metadata["reference_completion"], "\\boxed{\\frac{1}{2}}");
  EXPECT_EQ((*boxed)->verify(obs->metadata, "so the answer is \\boxed{0.5}")->reward, 1.0);
  EXPECT_EQ((*boxed)->verify(obs->metadata, "so the answer is 0.5")->reward, 0.0);
}

TEST(DatasetExtract, ConfigErrors) {
  auto path = write_file("ok.jsonl", R"({"question": "q", "answer": "Answer: 4"})" "\n");
  auto bad_how = EnvRegistry::global().create("dataset", {{"train", path}, {"extract", "last_line"}});
  ASSERT_FALSE(bad_how.ok());
  EXPECT_NE(bad_how.error().message.find("'extract' must be answer_tag, last_number, boxed, gsm8k or regex (got 'last_line')"),
            std::string::npos);
  auto bad_re = EnvRegistry::global().create("dataset", {{"train", path}, {"extract", "regex"}, {"pattern", "Answer: \\d+"}});
  ASSERT_FALSE(bad_re.ok());
  EXPECT_NE(bad_re.error().message.find("env dataset: 'pattern'"), std::string::npos) << bad_re.error().message;
  auto bad_type = EnvRegistry::global().create("dataset", {{"train", path}, {"extract_reference", "yes"}});
  ASSERT_FALSE(bad_type.ok());
  auto ok = EnvRegistry::global().create(
      "dataset", {{"train", path}, {"extract", "regex"}, {"pattern", "Answer: (\\d+)"}, {"verifier", "math"}, {"eval_fraction", 0.0}});
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  auto obs = (*ok)->reset(0, {});
  EXPECT_EQ(obs->metadata["answer"], "4");
  EXPECT_EQ((*ok)->verify(obs->metadata, "2+2... Answer: 4")->reward, 1.0);
}

}  // namespace
