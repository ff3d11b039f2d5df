// metrics.jsonl, TensorBoard event files and the progress display. The event file is written
// without libprotobuf: an Event is three or four fields, encoded by hand below (wire format:
// tag = field << 3 | wire type; varint, 64-bit, length-delimited and 32-bit types).
#include "troupe/launch/metrics.h"

#include "troupe/launch/run_dir_files.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace troupe::launch {
namespace fs = std::filesystem;

namespace {

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <class T>
void put_fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64, aarch64)
  out.append(b, sizeof(T));
}

void put_bytes_field(std::string& out, int field, const std::string& bytes) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event{wall_time=1 (double), step=2 (int64), file_version=3 (string) | summary=5 (Summary)}
std::string encode_event(double wall_time, int64_t step, const std::string* file_version, const std::string* summary) {
  std::string e;
  put_varint(e, 1 << 3 | 1);
  put_fixed(e, wall_time);
  put_varint(e, 2 << 3 | 0);
  put_varint(e, static_cast<uint64_t>(step));
  if (file_version) put_bytes_field(e, 3, *file_version);
  if (summary) put_bytes_field(e, 5, *summary);
  return e;
}

// Summary{value=1 (Value{tag=1 (string), simple_value=2 (float)})}
std::string encode_scalar_summary(const std::string& tag, float value) {
  std::string v;
  put_bytes_field(v, 1, tag);
  put_varint(v, 2 << 3 | 5);
  put_fixed(v, value);
  std::string s;
  put_bytes_field(s, 1, v);
  return s;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string format_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  int t = static_cast<int>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%dh%02dm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%dm%02ds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ds", t);
  return buf;
}

double num(const nlohmann::json& row, const char* key, double fallback = NAN) {
  auto it = row.find(key);
  return (it != row.end() && it->is_number()) ? it->get<double>() : fallback;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const auto table = make_crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

Result<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::open(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io, "cannot create " + dir + ": " + ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  double t = now_s();
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter());
  w->path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<long long>(t)) + "." + host + "." +
             std::to_string(getpid());
  w->f_ = std::fopen(w->path_.c_str(), "wb");
  if (!w->f_) return make_error(ErrorCode::io, "cannot write " + w->path_ + ": " + std::strerror(errno));
  std::string version = "brain.Event:2";
  TROUPE_TRY(w->write_record(encode_event(t, 0, &version, nullptr)));
  TROUPE_TRY(w->flush());
  return w;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

Status TensorBoardWriter::write_record(const std::string& data) {
  std::string rec;
  uint64_t len = data.size();
  put_fixed(rec, len);
  put_fixed(rec, masked_crc32c(&len, sizeof len));
  rec += data;
  put_fixed(rec, masked_crc32c(data.data(), data.size()));
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size())
    return make_error(ErrorCode::io, "cannot write " + path_ + ": " + std::strerror(errno));
  return {};
}

Status TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  std::string s = encode_scalar_summary(tag, static_cast<float>(value));
  return write_record(encode_event(wall_time, step, nullptr, &s));
}

Status TensorBoardWriter::flush() {
  if (std::fflush(f_) != 0) return make_error(ErrorCode::io, "cannot flush " + path_);
  return {};
}

std::vector<std::pair<std::string, double>> row_scalars(const nlohmann::json& row) {
  std::vector<std::pair<std::string, double>> out;
  const bool eval = row.contains("eval_accuracy") || row.contains("eval_reward_mean");
  const std::string prefix = eval ? std::string("eval") : row.value("phase", std::string("train"));
  for (auto it = row.begin(); it != row.end(); ++it) {
    if (!it.value().is_number() || it.key() == "step") continue;
    out.emplace_back(prefix + "/" + it.key(), it.value().get<double>());
  }
  return out;
}

Result<std::unique_ptr<MetricsSinks>> MetricsSinks::open(const std::string& run_dir, bool tensorboard,
                                                         ProgressOptions progress, int64_t resume_after_step) {
  std::unique_ptr<MetricsSinks> s(new MetricsSinks());
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) return make_error(ErrorCode::io, "cannot create the run directory " + run_dir + ": " + ec.message());
  std::string path = run_dir + "/metrics.jsonl";
  const std::string trajectories = run_dir + "/trajectories/grpo.jsonl";
  if (resume_after_step >= 0) {
    // keep the rows up to the checkpoint we resume from; later ones will be written again (the
    // trajectories too: each episode is in the log once). A torn last line is dropped.
    for (const std::string& p : {path, trajectories}) {
      TROUPE_ASSIGN_OR_RETURN(auto cut, keep_jsonl_rows_through(p, resume_after_step));
      std::fputs(describe_dropped_lines(p, cut).c_str(), stderr);
    }
  } else {
    fs::remove(trajectories, ec);  // a new run in a used run.dir: its episodes only, like its metrics
  }
  s->jsonl_ = std::fopen(path.c_str(), resume_after_step >= 0 ? "ab" : "wb");
  if (!s->jsonl_) return make_error(ErrorCode::io, "cannot write " + path + ": " + std::strerror(errno));
  if (tensorboard) {
    TROUPE_ASSIGN_OR_RETURN(s->tb_, TensorBoardWriter::open(run_dir + "/tb"));
  }
  s->progress_ = std::move(progress);
  s->tty_ = s->progress_.mode == actors::ProgressMode::tty ||
            (s->progress_.mode == actors::ProgressMode::detect && isatty(STDERR_FILENO));
  return s;
}

MetricsSinks::~MetricsSinks() {
  finish();
  if (jsonl_) std::fclose(jsonl_);
}

Status MetricsSinks::write(const nlohmann::json& row) {
  std::string line = row.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), jsonl_) != line.size() || std::fflush(jsonl_) != 0)
    return make_error(ErrorCode::io, "cannot append to metrics.jsonl: " + std::string(std::strerror(errno)));
  if (tb_ || wandb_) {
    const int64_t step = row.value("step", int64_t{0});
    const auto scalars = row_scalars(row);
    if (tb_) {
      double wall = now_s();
      for (const auto& [tag, value] : scalars) TROUPE_TRY(tb_->add_scalar(tag, value, step, wall));
      TROUPE_TRY(tb_->flush());
    }
    if (wandb_) wandb_->log(step, scalars);
  }
  show_progress(row);
  return {};
}

void MetricsSinks::message(const std::string& text) {
  if (progress_.mode == actors::ProgressMode::off) return;
  if (line_open_) {
    std::fputs("\r\033[K", stderr);
    line_open_ = false;
  }
  std::fprintf(stderr, "[troupe] %s\n", text.c_str());
}

void MetricsSinks::show_progress(const nlohmann::json& row) {
  if (progress_.mode == actors::ProgressMode::off) return;
  bool eval = row.contains("eval_accuracy");
  std::string phase = row.value("phase", std::string("?"));
  long long step = row.value("step", 0LL);
  if (eval) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "eval  %-4s step %lld: accuracy %.3f, reward %.3f", phase.c_str(), step,
                  num(row, "eval_accuracy"), num(row, "eval_reward_mean"));
    message(buf);
    return;
  }
  ++steps_done_;
  double wall = num(row, "wall_s", 0);
  if (first_wall_ < 0) first_wall_ = wall;
  double reward = num(row, "reward_mean");
  if (std::isfinite(reward)) last_reward_ = reward;
  double per_step = steps_done_ > 1 ? (wall - first_wall_) / (steps_done_ - 1) : wall;
  double eta = progress_.total_steps > 0 ? per_step * (progress_.total_steps - step) : NAN;
  char buf[320];
  std::string what = std::isfinite(reward) ? "reward" : "loss";
  double shown = std::isfinite(reward) ? reward : num(row, "loss");
  std::snprintf(buf, sizeof buf, "%s %-4s step %lld/%d | %s %.3f | %.0f tok/s | ETA %s", progress_.name.c_str(),
                phase.c_str(), step, progress_.total_steps, what.c_str(), shown, num(row, "tokens_per_s", 0),
                format_eta(eta).c_str());
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", buf);
    std::fflush(stderr);
    line_open_ = true;
  } else {
    std::fprintf(stderr, "[troupe] %s\n", buf);
  }
}

void MetricsSinks::finish() {
  if (line_open_) {
    std::fputs("\n", stderr);
    line_open_ = false;
  }
  if (tb_) (void)tb_->flush();
  if (jsonl_) std::fflush(jsonl_);
  if (wandb_) wandb_->finish();  // waits for wandb.finish(); its complaints become log lines
}

}  // namespace troupe::launch
