// Crash-consistent writes to a run directory's files (see run_dir_files.h): atomic replacement by
// rename, and a JSON-lines file cut back to a step by one truncate(2) (or a renamed copy).
// Invariant: no call leaves a file half-written, whatever instant the process is killed at.
#include "troupe/launch/run_dir_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace troupe::launch {
namespace fs = std::filesystem;

namespace {

Error io_error(const std::string& what, const std::string& path) {
  return make_error(ErrorCode::io, "cannot " + what + " " + path + ": " + std::strerror(errno));
}

Status write_all(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return io_error("write", path);
    data += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

Status fsync_dir_of(const std::string& path) {
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return io_error("open", dir.string());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return io_error("fsync", dir.string());
  return {};
}

// Creates PATH.tmp.PID, lets `fill(fd, tmp)` write it, fsyncs it, renames it over PATH and fsyncs
// the folder. On any failure the temporary file is removed and PATH is as it was.
template <class Fill>
Status replace_by_rename(const std::string& path, Fill&& fill) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return io_error("create", tmp);
  Status st = fill(fd, tmp);
  if (st.ok() && ::fsync(fd) != 0) st = io_error("fsync", tmp);
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = io_error("rename a temporary file over", path);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return fsync_dir_of(path);
}

// Writes the chosen lines of `path` (with a newline each) to a temporary file and renames it over `path`.
Status rewrite_lines(const std::string& path, const std::vector<char>& keep) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("read", path);
  return replace_by_rename(path, [&](int fd, const std::string& tmp) {
    Status st;
    size_t i = 0;
    for (std::string line; st.ok() && std::getline(in, line); ++i)
      if (i < keep.size() && keep[i]) {
        line += '\n';
        st = write_all(fd, line.data(), line.size(), tmp);
      }
    return st;
  });
}

}  // namespace

Status write_file_atomic(const std::string& path, const std::string& text) {
  return replace_by_rename(path, [&](int fd, const std::string& tmp) { return write_all(fd, text.data(), text.size(), tmp); });
}

Result<JsonlCut> keep_jsonl_rows_through(const std::string& path, int64_t step) {
  JsonlCut cut;
  std::error_code ec;
  if (!fs::exists(path, ec)) return cut;
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("read", path);
  std::vector<char> keep;        // per line
  std::vector<uint64_t> starts;  // per line: its byte offset
  uint64_t offset = 0;
  bool last_has_newline = true;
  for (std::string line; std::getline(in, line);) {
    const bool newline = !in.eof();  // getline stopped at '\n', not at the end of the file
    starts.push_back(offset);
    offset += line.size() + (newline ? 1 : 0);
    last_has_newline = newline;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    const bool row = !j.is_discarded() && j.is_object();
    if (!row) {
      if (!newline)
        cut.torn_last_line = static_cast<int64_t>(starts.size());
      else if (!line.empty())
        cut.unparsable_lines.push_back(static_cast<int64_t>(starts.size()));
    }
    const bool kept = row && j.value("step", int64_t{0}) <= step;
    if (row && !kept) ++cut.dropped_after_step;
    cut.kept += kept ? 1 : 0;
    keep.push_back(kept ? 1 : 0);
  }
  in.close();
  // The lines dropped are usually a suffix (rows after the checkpoint, a torn last line): one
  // truncate(2) removes them, which no kill can leave half-done. Otherwise a renamed copy.
  size_t first_dropped = keep.size();
  while (first_dropped > 0 && !keep[first_dropped - 1]) --first_dropped;
  bool suffix = true;
  for (size_t i = 0; i < first_dropped; ++i) suffix = suffix && keep[i];
  if (!suffix) {
    TROUPE_TRY(rewrite_lines(path, keep));
    return cut;
  }
  if (first_dropped < keep.size()) {
    if (::truncate(path.c_str(), static_cast<off_t>(starts[first_dropped])) != 0) return io_error("truncate", path);
  } else if (!last_has_newline) {  // a whole last row that lost only its newline
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
    if (fd < 0) return io_error("open", path);
    Status st = write_all(fd, "\n", 1, path);
    ::close(fd);
    TROUPE_TRY(st);
  }
  return cut;
}

std::string describe_dropped_lines(const std::string& path, const JsonlCut& cut) {
  std::string out;
  for (int64_t n : cut.unparsable_lines)
    out += "troupe: warning: " + path + ":" + std::to_string(n) + ": not a JSON object; the line is dropped\n";
  if (cut.torn_last_line > 0)
    out += "troupe: warning: " + path + ":" + std::to_string(cut.torn_last_line) +
           ": a torn last line (the run was killed while writing it); the line is dropped\n";
  return out;
}

}  // namespace troupe::launch
