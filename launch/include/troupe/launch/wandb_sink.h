// The W&B sink (logger.wandb): a Python process of its own (launch/wandb_sink.py, the real `wandb`
// package) that takes the run's scalars over a socket, one JSON line per row. Invariant: once the
// run started, nothing the W&B process does (exit, crash, stall) fails or stops training.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/experiment_config.h"
#include "troupe/base/result.h"

namespace troupe::launch {

struct WandbOptions {
  std::string project;
  std::string name;                      // the W&B run's name
  actors::WandbMode mode = actors::WandbMode::online;
  std::string run_dir;                   // wandb.init(dir=...): run_dir/wandb/; the log: run_dir/logs/wandb.log
  std::string config_file;               // a YAML file given to wandb.init(config=...) ("" = none)
  std::string python;                    // the interpreter (default: troupe::python_executable())
  double start_timeout_s = 300;          // import wandb + wandb.init must answer within this
  double finish_timeout_s = 300;         // wandb.finish (an online run uploads what is left)
};

class WandbSink {
 public:
  // Starts the process and waits until wandb.init succeeded. A Python without `wandb`, a failed
  // init (e.g. online without a login) or no answer in time is an error quoting the process's log.
  // `warn` gets the one message said when the process stops during the run.
  static Result<std::unique_ptr<WandbSink>> start(const WandbOptions& options,
                                                  std::function<void(const std::string&)> warn);
  ~WandbSink();
  WandbSink(const WandbSink&) = delete;
  WandbSink& operator=(const WandbSink&) = delete;

  // One history row at `step`. Never fails: a W&B process that is gone (or has not read for
  // 30 s) is reported once through `warn` and every later row is dropped.
  void log(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  // Closes the stream; the process calls wandb.finish() and exits (waited for up to finish_timeout_s).
  void finish();
  bool alive() const { return fd_ >= 0; }
  const std::string& log_path() const { return log_path_; }

 private:
  WandbSink() = default;
  void give_up(const std::string& why);
  std::string exit_status_text();
  int fd_ = -1;
  pid_t pid_ = -1;
  std::string log_path_;
  double finish_timeout_s_ = 300;
  std::function<void(const std::string&)> warn_;
};

}  // namespace troupe::launch
