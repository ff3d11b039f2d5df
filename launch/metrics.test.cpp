// launch.metrics_*: CRC-32C matches its check value; metrics.jsonl has one row per write and is cut
// back on resume (a torn last line dropped, named); the TensorBoard events read back with the
// `tensorboard` package; troupe report draws report.png from a run directory (a torn last line left out).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "troupe/base/build_config.h"
#include "troupe/launch/metrics.h"
#include "troupe/launch/run_dir_files.h"

using namespace troupe::launch;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("troupe_metrics_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

void write_rows(const std::string& dir, int steps, int64_t resume_after = -1, const std::string& progress = "off") {
  auto sinks = MetricsSinks::open(dir, progress == "off", ProgressOptions{*troupe::enum_from_name<troupe::actors::ProgressMode>(progress), "t", steps}, resume_after);
  ASSERT_TRUE(sinks.ok()) << sinks.error().message;
  for (int s = resume_after < 0 ? 1 : static_cast<int>(resume_after + 1); s <= steps; ++s) {
    nlohmann::json row = {{"step", s}, {"phase", s <= 2 ? "sft" : "grpo"}, {"wall_s", 0.1 * s},
                          {"reward_mean", 0.1 * s}, {"loss", 1.0 / s}, {"tokens_per_s", 100.0}};
    ASSERT_TRUE((*sinks)->write(row).ok());
    if (s == 2 || s == steps) {
      nlohmann::json ev = {{"step", s}, {"phase", s <= 2 ? "sft" : "grpo"}, {"eval_accuracy", 0.05 * s},
                           {"eval_reward_mean", 0.06 * s}};
      ASSERT_TRUE((*sinks)->write(ev).ok());
    }
  }
}

int run_python(const std::string& script, const std::string& arg) {
  std::string path = fs::temp_directory_path() / ("troupe_metrics_check_" + std::to_string(getpid()) + ".py");
  std::ofstream(path) << script;
  std::string cmd = troupe::python_executable() + " " + path + " " + arg;
  return std::system(cmd.c_str());
}

}  // namespace

TEST(Metrics, Crc32c) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);
}

TEST(Metrics, JsonlAndResume) {
  std::string dir = temp_dir("jsonl");
  write_rows(dir, 5);
  auto count = [&]() {
    std::ifstream in(dir + "/metrics.jsonl");
    int n = 0;
    for (std::string l; std::getline(in, l);) {
      auto j = nlohmann::json::parse(l);
      EXPECT_TRUE(j.contains("step"));
      ++n;
    }
    return n;
  };
  EXPECT_EQ(count(), 7);
  write_rows(dir, 5, 2);  // resume after step 2: rows 3..5 (and the final eval) are written again
  EXPECT_EQ(count(), 7);
  fs::remove_all(dir);
}

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}  // namespace

// What a kill -9 leaves and a --resume repairs: a torn last line (no newline) is dropped and named
// (FILE:LINE), rows after the resumed step go, a whole last row that lost only its newline gets it
// back; a line in the middle that is not JSON is dropped and named too (the file then rewritten by
// rename, never in place). A new run in a used run.dir starts its trajectories afresh.
TEST(Metrics, ResumeCutsTornAndLaterLines) {
  std::string dir = temp_dir("torn");
  const std::string m = dir + "/metrics.jsonl";
  std::ofstream(m) << "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n{\"step\":4,\"reward_m";
  auto cut = keep_jsonl_rows_through(m, 2);
  ASSERT_TRUE(cut.ok()) << cut.error().message;
  EXPECT_EQ(slurp(m), "{\"step\":1}\n{\"step\":2}\n");
  EXPECT_EQ(cut->kept, 2);
  EXPECT_EQ(cut->dropped_after_step, 1);
  EXPECT_EQ(cut->torn_last_line, 4);
  EXPECT_EQ(describe_dropped_lines(m, *cut),
            "troupe: warning: " + m + ":4: a torn last line (the run was killed while writing it); the line is dropped\n");
  std::ofstream(m) << "{\"step\":1}\n{\"step\":2}";  // only the newline lost: the row is whole
  cut = keep_jsonl_rows_through(m, 2);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(slurp(m), "{\"step\":1}\n{\"step\":2}\n");
  EXPECT_EQ(cut->torn_last_line, 0);
  std::ofstream(m) << "{\"step\":1}\ngarbage\n{\"step\":2}\n{\"step\":5}\n";
  cut = keep_jsonl_rows_through(m, 2);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(slurp(m), "{\"step\":1}\n{\"step\":2}\n");
  EXPECT_EQ(cut->unparsable_lines, std::vector<int64_t>{2});
  EXPECT_NE(describe_dropped_lines(m, *cut).find(m + ":2: not a JSON object"), std::string::npos);
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename(), "metrics.jsonl") << e.path();
  EXPECT_TRUE(keep_jsonl_rows_through(dir + "/none.jsonl", 2).ok());
  EXPECT_FALSE(fs::exists(dir + "/none.jsonl"));
  // write_file_atomic: the new text, nothing else left beside it
  ASSERT_TRUE(write_file_atomic(dir + "/config.resolved.yaml", "a: 1\n").ok());
  ASSERT_TRUE(write_file_atomic(dir + "/config.resolved.yaml", "a: 2\n").ok());
  EXPECT_EQ(slurp(dir + "/config.resolved.yaml"), "a: 2\n");
  EXPECT_FALSE(write_file_atomic(dir + "/no/such/dir/x", "x").ok());
  // a resume keeps the trajectories through its step, a new run starts them afresh
  fs::create_directories(dir + "/trajectories");
  std::ofstream(dir + "/trajectories/grpo.jsonl") << "{\"step\":1}\n{\"step\":3}\n{\"step\":4,";
  write_rows(dir, 5, 2);
  EXPECT_EQ(slurp(dir + "/trajectories/grpo.jsonl"), "{\"step\":1}\n");
  write_rows(dir, 5);
  EXPECT_FALSE(fs::exists(dir + "/trajectories/grpo.jsonl"));
  fs::remove_all(dir);
}

// logger.progress: on a terminal one line rewritten in place (step/total, reward or loss, tok/s,
// ETA), eval results and messages on lines of their own; plain: one log line per step.
TEST(Metrics, ProgressLines) {
  std::string dir = temp_dir("progress");
  testing::internal::CaptureStderr();
  write_rows(dir, 5, -1, "tty");
  std::string tty = testing::internal::GetCapturedStderr();
  EXPECT_NE(tty.find("\r\033[Kt sft  step 1/5 | reward 0.100 | 100 tok/s | ETA"), std::string::npos) << tty;
  EXPECT_NE(tty.find("\r\033[Kt grpo step 4/5 | reward 0.400 | 100 tok/s | ETA"), std::string::npos) << tty;
  EXPECT_NE(tty.find("\r\033[K[troupe] eval  sft  step 2: accuracy 0.100, reward 0.120\n"), std::string::npos) << tty;
  EXPECT_EQ(tty.find("[troupe] t "), std::string::npos) << "no step log lines on a terminal";
  fs::remove_all(dir);
  dir = temp_dir("plain");
  testing::internal::CaptureStderr();
  write_rows(dir, 5, -1, "plain");
  std::string plain = testing::internal::GetCapturedStderr();
  EXPECT_EQ(plain.find('\r'), std::string::npos) << plain;
  EXPECT_NE(plain.find("[troupe] t grpo step 3/5 | reward 0.300 | 100 tok/s | ETA"), std::string::npos) << plain;
  int lines = 0;
  for (char ch : plain) lines += ch == '\n';
  EXPECT_EQ(lines, 5 + 2) << "a line per step and per eval";
  fs::remove_all(dir);
}

TEST(Metrics, TensorBoardReadBack) {
  std::string dir = temp_dir("tb");
  write_rows(dir, 5);
  const char* script = R"PY(
import sys, glob
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
files = glob.glob(sys.argv[1] + "/tb/events.out.tfevents.*")
assert len(files) == 1, files
acc = EventAccumulator(files[0])
acc.Reload()
tags = acc.Tags()["scalars"]
for t in ("grpo/reward_mean", "sft/reward_mean", "eval/eval_accuracy", "grpo/loss"):
    assert t in tags, (t, tags)
r = acc.Scalars("grpo/reward_mean")
assert [e.step for e in r] == [3, 4, 5], [e.step for e in r]
assert abs(r[-1].value - 0.5) < 1e-6, r[-1].value
ev = acc.Scalars("eval/eval_accuracy")
assert [e.step for e in ev] == [2, 5]
assert abs(ev[1].value - 0.25) < 1e-6
print("tensorboard read", len(tags), "tags")
)PY";
  EXPECT_EQ(run_python(script, dir), 0);
  fs::remove_all(dir);
}

TEST(Metrics, Report) {
  std::string dir = temp_dir("report");
  write_rows(dir, 5);
  std::string cmd = std::string(TROUPE_BINARY_DIR) + "/bin/troupe report " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  ASSERT_TRUE(fs::exists(dir + "/report.png"));
  std::ifstream in(dir + "/report.png", std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  // a torn last line (a run killed mid-write) is left out with a warning naming it; a bad line
  // before the last is an error naming FILE:LINE (exit 2)
  std::ofstream(dir + "/metrics.jsonl", std::ios::app) << "{\"step\": 6, \"rew";
  const std::string err = dir + "/report.err";
  ASSERT_EQ(std::system((cmd + " 2> " + err).c_str()), 0);
  EXPECT_NE(slurp(err).find(dir + "/metrics.jsonl:8: warning: a torn last line"), std::string::npos) << slurp(err);
  std::ofstream(dir + "/metrics.jsonl", std::ios::app) << "\n{\"step\": 7}\n";
  int bad = std::system((cmd + " 2> " + err).c_str());
  EXPECT_EQ(WEXITSTATUS(bad), 2);
  EXPECT_NE(slurp(err).find(dir + "/metrics.jsonl:8: error: not a JSON object"), std::string::npos) << slurp(err);
  // a directory without metrics is a clear error (exit 2)
  std::string empty = temp_dir("report_empty");
  int rc = std::system((std::string(TROUPE_BINARY_DIR) + "/bin/troupe report " + empty + " 2>/dev/null").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  fs::remove_all(dir);
  fs::remove_all(empty);
}
