// Metrics sinks of a run directory: metrics.jsonl (one JSON object per row, flushed per row),
// TensorBoard event files in tb/ (TFRecord framing + hand-encoded Event protos), and the progress
// display (a redrawn line on a terminal, plain log lines otherwise). Rows are the coordinator's.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/experiment_config.h"
#include "troupe/base/result.h"
#include "troupe/launch/wandb_sink.h"

namespace troupe::launch {

// CRC-32C (Castagnoli) and the TFRecord mask of it.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

// Writes scalar summaries as TensorBoard reads them: tb/events.out.tfevents.<time>.<host>.
class TensorBoardWriter {
 public:
  static Result<std::unique_ptr<TensorBoardWriter>> open(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  Status add_scalar(const std::string& tag, double value, int64_t step, double wall_time);
  Status flush();
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter() = default;
  Status write_record(const std::string& data);
  std::FILE* f_ = nullptr;
  std::string path_;
};

// A row's scalars as TensorBoard and W&B name them: each numeric field but "step" as
// "<phase>/<field>" (eval rows, those with eval_accuracy or eval_reward_mean: "eval/<field>").
std::vector<std::pair<std::string, double>> row_scalars(const nlohmann::json& row);

// The sinks together. Every row has "step" and "phase"; its row_scalars go to TensorBoard and,
// when attached, to W&B.
struct ProgressOptions {
  actors::ProgressMode mode = actors::ProgressMode::detect;  // logger.progress
  std::string name;
  int total_steps = 0;        // across phases, for the ETA
};

class MetricsSinks {
 public:
  // resume_after_step >= 0 (a --resume): the rows of metrics.jsonl and trajectories/grpo.jsonl after
  // that step, and a torn last line, are dropped first (keep_jsonl_rows_through; a warning names a
  // dropped torn line), then rows are appended. A new run (-1): both files start afresh.
  static Result<std::unique_ptr<MetricsSinks>> open(const std::string& run_dir, bool tensorboard,
                                                    ProgressOptions progress, int64_t resume_after_step = -1);
  Status write(const nlohmann::json& row);
  void message(const std::string& text);  // a log line that does not disturb the progress line
  // Rows from now on also go to W&B (logger.wandb); its failures become one message().
  void attach_wandb(std::unique_ptr<WandbSink> wandb) { wandb_ = std::move(wandb); }
  void finish();

 private:
  MetricsSinks() = default;
  void show_progress(const nlohmann::json& row);
  std::FILE* jsonl_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tb_;
  std::unique_ptr<WandbSink> wandb_;
  ProgressOptions progress_;
  bool tty_ = false;
  bool line_open_ = false;
  int steps_done_ = 0;
  double first_wall_ = -1;
  double last_reward_ = 0;

 public:
  ~MetricsSinks();
};

}  // namespace troupe::launch
