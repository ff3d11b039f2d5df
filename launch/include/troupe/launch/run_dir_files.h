// Crash-consistent writes to a run directory's own files (config.resolved.yaml, metrics.jsonl and
// trajectories/*.jsonl when a --resume cuts them back). Invariant: a kill -9 at any instant leaves
// each such file either as it was before the call or as the call wrote it, never half-written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::launch {

// Replaces `path` by `text` atomically: written to PATH.tmp.PID, fsynced, renamed over `path`, the
// directory fsynced.
Status write_file_atomic(const std::string& path, const std::string& text);

// What cutting a JSON-lines file back did: the lines dropped for having a "step" after the cut,
// and the line numbers (1-based) dropped for not being JSON objects (a torn last line, one without
// its newline, is what a kill -9 in the middle of a write leaves).
struct JsonlCut {
  int64_t kept = 0;
  int64_t dropped_after_step = 0;
  int64_t torn_last_line = 0;             // its line number, 0 = none
  std::vector<int64_t> unparsable_lines;  // other lines that are not JSON objects
};

// Keeps the lines of the JSON-lines file `path` whose "step" (0 when absent) is at most `step`,
// drops the others and every line that is not a JSON object, and rewrites the file atomically when
// anything was dropped (a missing file is left missing). A --resume calls it with the checkpoint's
// step on metrics.jsonl and trajectories/grpo.jsonl, so every row after the checkpoint is written once,
// by the resumed run.
Result<JsonlCut> keep_jsonl_rows_through(const std::string& path, int64_t step);

// One line per dropped unparsable line of `cut`: "troupe: warning: FILE:LINE: ..." (empty: none).
std::string describe_dropped_lines(const std::string& path, const JsonlCut& cut);

}  // namespace troupe::launch
