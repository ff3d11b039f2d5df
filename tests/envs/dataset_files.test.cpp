// The `dataset` env's files and sampling order: JSONL, parquet, a save_to_disk Dataset, a
// DatasetDict and a Hub-cache-like folder give the same rows; split, eval_split and max_rows;
// shuffle (every row once per epoch, the order from the seed); each error names the file and row.
// Fixtures are written by make_fixtures.py with a Python that has pyarrow and datasets
// (ensure_pyarrow.py installs them into $TROUPE_CACHE/venv-datasets on first use).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "troupe/base/build_config.h"
#include "troupe/envs/builtin.h"

namespace {

using troupe::envs::json;
using troupe::envs::ResetOptions;
using troupe::envs::Split;

std::string run_text(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (::pclose(p) != 0) return "";
  return out;
}

// The Python with pyarrow, and the fixtures it wrote (once per test binary).
struct Fixtures {
  std::string python, dir;
};

const Fixtures& fixtures() {
  static Fixtures f = [] {
    Fixtures x;
    std::string out = run_text(troupe::python_executable() + " " TROUPE_TEST_SOURCE_DIR
                               "/tests/envs/dataset_files/ensure_pyarrow.py");
    while (!out.empty() && out.back() == '\n') out.pop_back();
    x.python = out.substr(out.rfind('\n') + 1);
    x.dir = (std::filesystem::temp_directory_path() / ("troupe-dataset-files-" + std::to_string(::getpid()))).string();
    if (!x.python.empty() &&
        run_text(x.python + " " TROUPE_TEST_SOURCE_DIR "/tests/envs/dataset_files/make_fixtures.py " + x.dir +
                 " 2>/dev/null && echo ok") != "ok\n")
      x.python.clear();
    return x;
  }();
  return f;
}

class DatasetFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    if (fixtures().python.empty()) GTEST_FAIL() << "no Python with pyarrow and datasets (ensure_pyarrow.py failed)";
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(fixtures().dir, ec);
  }
  static json config(json extra) {
    json c = {{"base_dir", fixtures().dir}, {"python", fixtures().python}, {"eval_fraction", 0}};
    for (auto it = extra.begin(); it != extra.end(); ++it) c[it.key()] = it.value();
    return c;
  }
  static troupe::Result<std::unique_ptr<troupe::envs::Env>> make(json extra) {
    return troupe::envs::make_dataset_env(config(std::move(extra)));
  }
  // The prompt, answer and fields of draws seed 0..n-1 (row seed mod N) of a split.
  static std::vector<json> rows_of(troupe::envs::Env& env, int n, Split split = Split::train) {
    std::vector<json> out;
    for (int i = 0; i < n; ++i) {
      ResetOptions o;
      o.split = split;
      auto obs = env.reset(static_cast<uint64_t>(i), o);
      EXPECT_TRUE(obs.ok()) << obs.error().message;
      if (!obs.ok()) break;
      json m = obs->metadata;
      m.erase("row");
      m["prompt"] = obs->text;
      out.push_back(m);
      env.release();
    }
    return out;
  }
  static std::string error_of(json extra) {
    auto env = make(std::move(extra));
    return env.ok() ? std::string("(no error)") : env.error().message;
  }
};

TEST_F(DatasetFiles, EveryFormatGivesTheSameRows) {
  auto jsonl = make({{"train", "rows.jsonl"}});
  ASSERT_TRUE(jsonl.ok()) << jsonl.error().message;
  const auto want = rows_of(**jsonl, 12);
  ASSERT_EQ(want.size(), 12u);
  EXPECT_EQ(want[3]["prompt"], "train question 3: 3 + 3 = ? \u00e9");
  EXPECT_EQ(want[3]["numbers"], json::array({3, 4}));
  for (const char* path : {"rows.parquet", "saved", "dict", "hub"}) {
    auto env = make({{"train", path}});
    ASSERT_TRUE(env.ok()) << path << ": " << env.error().message;
    EXPECT_EQ(rows_of(**env, 12), want) << path;
  }
  // each row names where it came from: FILE:ROW, a DatasetDict split as DIR[SPLIT]:ROW
  auto dict = make({{"train", "dict"}});
  auto obs = (*dict)->reset(4, {});
  ASSERT_TRUE(obs.ok());
  EXPECT_EQ(obs->metadata["row"], fixtures().dir + "/dict[train]:5");
}

TEST_F(DatasetFiles, SplitEvalSplitAndMaxRows) {
  auto test_rows = make({{"train", "test.jsonl"}});
  ASSERT_TRUE(test_rows.ok());
  const auto want_test = rows_of(**test_rows, 5);
  for (const char* dir : {"dict", "hub"}) {
    auto env = make({{"train", dir}, {"split", "test"}});
    ASSERT_TRUE(env.ok()) << env.error().message;
    EXPECT_EQ(rows_of(**env, 5), want_test) << dir;
    // train and eval from one directory: eval takes its `test` split unless eval_split says otherwise
    auto both = make({{"train", dir}, {"eval", dir}});
    ASSERT_TRUE(both.ok()) << both.error().message;
    auto eval = rows_of(**both, 5, Split::eval);
    for (auto& r : eval) r["split"] = "train";
    EXPECT_EQ(eval, want_test) << dir;
  }
  for (const char* path : {"rows.jsonl", "rows.parquet", "dict"}) {
    auto env = make({{"train", path}, {"max_rows", 3}});
    ASSERT_TRUE(env.ok()) << env.error().message;
    std::set<std::string> prompts;
    for (const auto& r : rows_of(**env, 9)) prompts.insert(r["prompt"].get<std::string>());
    EXPECT_EQ(prompts.size(), 3u) << path;
    EXPECT_TRUE(prompts.count("train question 2: 2 + 2 = ? \u00e9")) << path;
  }
}

TEST_F(DatasetFiles, ShuffleTakesEveryRowOncePerEpoch) {
  auto order_of = [](troupe::envs::Env& env, int draws) {
    std::vector<std::string> out;
    for (int n = 0; n < draws; ++n) {
      ResetOptions o;
      o.extra["draw"] = static_cast<uint64_t>(n);
      auto obs = env.reset(777, o);  // the seed does not choose the row, the draw does
      EXPECT_TRUE(obs.ok());
      if (!obs.ok()) break;
      EXPECT_EQ(obs->metadata["epoch"], n / 12);
      out.push_back(obs->text);
      env.release();
    }
    return out;
  };
  auto a = make({{"train", "rows.parquet"}, {"shuffle", true}, {"seed", 5}});
  auto b = make({{"train", "rows.jsonl"}, {"shuffle", true}, {"seed", 5}});
  auto c = make({{"train", "rows.jsonl"}, {"shuffle", true}, {"seed", 6}});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const auto first = order_of(**a, 36);
  for (int e = 0; e < 3; ++e) {
    std::set<std::string> epoch(first.begin() + 12 * e, first.begin() + 12 * (e + 1));
    EXPECT_EQ(epoch.size(), 12u) << "epoch " << e;
  }
  EXPECT_NE(std::vector<std::string>(first.begin(), first.begin() + 12),
            std::vector<std::string>(first.begin() + 12, first.begin() + 24));  // each epoch its own order
  EXPECT_EQ(order_of(**b, 36), first);  // same seed, same order (whatever the format)
  EXPECT_NE(order_of(**c, 36), first);
  // without a draw (and on the eval split) the row is seed mod N, as without shuffle
  auto plain = make({{"train", "rows.jsonl"}});
  EXPECT_EQ(rows_of(**a, 12), rows_of(**plain, 12));
}

TEST_F(DatasetFiles, ErrorsNameTheFileAndRow) {
  const std::string d = fixtures().dir;
  EXPECT_NE(error_of({{"train", "no_answer.parquet"}}).find(d + "/no_answer.parquet:1: error: row has no answer field 'answer'"),
            std::string::npos) << error_of({{"train", "no_answer.parquet"}});
  EXPECT_NE(error_of({{"train", "null_answer.parquet"}}).find(d + "/null_answer.parquet:3: error: answer field 'answer' must be"),
            std::string::npos) << error_of({{"train", "null_answer.parquet"}});
  EXPECT_NE(error_of({{"train", "rows.parquet"}, {"template", "{nope}"}}).find(d + "/rows.parquet:1: error: row has no field 'nope'"),
            std::string::npos);
  EXPECT_NE(error_of({{"train", "empty.parquet"}}).find(d + "/empty.parquet: has no rows"), std::string::npos)
      << error_of({{"train", "empty.parquet"}});
  EXPECT_NE(error_of({{"train", "garbage.parquet"}}).find(d + "/garbage.parquet: cannot read"), std::string::npos)
      << error_of({{"train", "garbage.parquet"}});
  EXPECT_NE(error_of({{"train", "dict"}, {"split", "dev"}}).find(d + "/dict: no split 'dev' (splits: test, train)"),
            std::string::npos) << error_of({{"train", "dict"}, {"split", "dev"}});
  EXPECT_NE(error_of({{"train", "saved"}, {"split", "dev"}}).find("holds one unnamed split"), std::string::npos);
  EXPECT_NE(error_of({{"train", "rows.jsonl"}, {"split", "train"}}).find("is a JSONL file: 'split' applies to a datasets directory"),
            std::string::npos);
  EXPECT_NE(error_of({{"train", "rows.jsonl"}, {"eval_split", "test"}}).find("'eval_split' needs 'eval'"), std::string::npos);
  EXPECT_NE(error_of({{"train", "missing.parquet"}}).find("cannot open '" + d + "/missing.parquet'"), std::string::npos);
  EXPECT_NE(error_of({{"train", "rows.jsonl"}, {"shuffle", "yes"}}).find("'shuffle' must be true or false"), std::string::npos);
  EXPECT_NE(error_of({{"train", "rows.jsonl"}, {"max_rows", -1}}).find("'max_rows' must be between 0"), std::string::npos);
  EXPECT_NE(error_of({{"train", "rows.parquet"}, {"python", "/nonexistent/python"}}).find("cannot start '/nonexistent/python'"),
            std::string::npos) << error_of({{"train", "rows.parquet"}, {"python", "/nonexistent/python"}});
  // a Python without pyarrow: the error says how to install it
  if (run_text("/usr/bin/python3 -c 'import pyarrow' 2>/dev/null && echo has") != "has\n") {
    const std::string e = error_of({{"train", "rows.parquet"}, {"python", "/usr/bin/python3"}});
    EXPECT_NE(e.find("needs pyarrow"), std::string::npos) << e;
    EXPECT_NE(e.find("'" + d + "/rows.parquet': "), std::string::npos) << e;
    EXPECT_NE(e.find("-m pip install pyarrow"), std::string::npos) << e;
  }
}

}  // namespace
