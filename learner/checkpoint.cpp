// Checkpoint save/load (see checkpoint.h). Durability order: files -> fsync each -> fsync the temp
// dir -> rename to step_N -> fsync checkpoints/ -> symlink swap for latest/best -> prune (each old
// step renamed aside, then removed). A kill at any point leaves latest on a whole step.
#include "troupe/learner/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/safetensors.h"
#include "troupe/policy/io/sharded_weights.h"

namespace troupe::learner {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFile = "state.json";

Error io_error(const std::string& m) { return make_error(ErrorCode::io, "checkpoint: " + m); }

Status fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return io_error("cannot open " + p.string() + " to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return io_error("fsync failed for " + p.string());
  return {};
}

Status write_text_file(const fs::path& p, const std::string& text) {
  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    if (!f) return io_error("cannot write " + p.string());
    f << text;
    if (!f.flush()) return io_error("short write to " + p.string());
  }
  return fsync_path(p, false);
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Every regular file under dir (relative paths, sorted), except state.json at the top.
std::vector<std::string> files_under(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::string rel = fs::relative(e.path(), dir).string();
    if (rel != kStateFile) out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<int64_t> step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

Status swap_symlink(const fs::path& dir, const std::string& name, const std::string& target) {
  const fs::path tmp = dir / ("." + name + ".tmp." + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_directory_symlink(target, tmp, ec);
  if (ec) return io_error("cannot create symlink " + tmp.string() + ": " + ec.message());
  fs::rename(tmp, dir / name, ec);  // rename(2) replaces the old link atomically
  if (ec) return io_error("cannot rename " + tmp.string() + " to " + (dir / name).string() + ": " + ec.message());
  return fsync_path(dir, true);
}

// What a save killed half-way leaves in checkpoints/: its temporary step directory, a step moved
// aside, a link being swapped. None is a checkpoint (their names do not start with "step_").
bool is_leftover(const std::string& name) {
  for (const char* prefix : {".tmp_step_", ".old_step_", ".removing_step_", ".latest.tmp.", ".best.tmp."})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

void remove_leftovers(const fs::path& root) {
  std::error_code ec;
  std::vector<fs::path> old;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (is_leftover(e.path().filename().string())) old.push_back(e.path());
  for (const auto& p : old) fs::remove_all(p, ec);
}

// Removes a step directory so that no kill leaves a part of it under its own name: renamed aside
// first (one rename(2)), then deleted.
void remove_step(const fs::path& root, const std::string& name) {
  std::error_code ec;
  const fs::path aside = root / (".removing_" + name + "." + std::to_string(::getpid()));
  fs::rename(root / name, aside, ec);
  fs::remove_all(ec ? root / name : aside, ec);
}

Result<nlohmann::json> read_json_file(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return invalid_input("checkpoint: cannot read " + p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_input("checkpoint: " + p.string() + " is not a JSON object");
  return j;
}

std::vector<int64_t> shape_of(const policy::TensorSpec& s) { return s.shape; }

}  // namespace

Status fsync_file(const std::string& path) { return fsync_path(path, false); }

uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

Result<uint32_t> crc32_of_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return invalid_input("checkpoint: cannot read " + path);
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    crc = crc32_update(crc, buf.data(), static_cast<size_t>(f.gcount()));
  }
  return crc;
}

ModelDirWriter flat_model_writer(std::span<const float> params, const std::vector<policy::TensorSpec>& specs,
                                 nlohmann::json config_json) {
  return [params, specs, config_json](const std::string& dir) -> Status {
    policy::io::TensorMap map;
    for (const auto& s : specs) {
      if (s.offset + s.numel() > params.size())
        return make_error(ErrorCode::internal, "checkpoint: tensor " + s.name + " lies outside the parameter buffer");
      map[s.name] = policy::io::Tensor{s.shape, std::vector<float>(params.begin() + static_cast<std::ptrdiff_t>(s.offset),
                                                                   params.begin() + static_cast<std::ptrdiff_t>(s.offset + s.numel()))};
    }
    TROUPE_TRY(policy::io::write_safetensors((fs::path(dir) / "model.safetensors").string(), map));
    return write_text_file(fs::path(dir) / "config.json", config_json.dump(2) + "\n");
  };
}

ModelDirWriter policy_model_writer(const policy::Model& model, const policy::io::Tokenizer* tokenizer, int32_t bos,
                                   int32_t eos, int32_t pad) {
  return [&model, tokenizer, bos, eos, pad](const std::string& dir) -> Status {
    return policy::io::save_model(dir, model, tokenizer, policy::io::ExpertLayout::per_expert, bos, eos, pad);
  };
}

Status load_policy_model_params(const std::string& dir, policy::Model& model) {
  TROUPE_ASSIGN_OR_RETURN(auto loaded, policy::io::load_model(dir));
  const auto& a = loaded.model.tensors();
  const auto& b = model.tensors();
  if (a.size() != b.size())
    return invalid_input("checkpoint: " + dir + " has " + std::to_string(a.size()) + " tensors, the model has " +
                         std::to_string(b.size()));
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].shape != b[i].shape || a[i].offset != b[i].offset)
      return invalid_input("checkpoint: " + dir + ": tensor " + a[i].name + " " + policy::io::shape_string(a[i].shape) +
                           " does not match the model's " + b[i].name + " " + policy::io::shape_string(b[i].shape));
  return model.set_params(loaded.model.params());
}

Status read_flat_model(const std::string& dir, const std::vector<policy::TensorSpec>& specs, std::span<float> params) {
  TROUPE_ASSIGN_OR_RETURN(auto file, policy::io::SafetensorsFile::open((fs::path(dir) / "model.safetensors").string()));
  for (const auto& s : specs) {
    TROUPE_ASSIGN_OR_RETURN(auto t, file.read(s.name, shape_of(s)));
    if (s.offset + s.numel() > params.size())
      return make_error(ErrorCode::internal, "checkpoint: tensor " + s.name + " lies outside the parameter buffer");
    std::copy(t.data.begin(), t.data.end(), params.begin() + static_cast<std::ptrdiff_t>(s.offset));
  }
  return {};
}

Result<std::string> begin_checkpoint_dir(const std::string& checkpoints_dir, int64_t step, const std::string& tag) {
  const fs::path root(checkpoints_dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return io_error("cannot create " + root.string() + ": " + ec.message());
  remove_leftovers(root);  // (one process saves at a time: rank 0, the others wait for it)
  const fs::path tmp = root / (".tmp_step_" + std::to_string(step) + "." + tag);
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) return io_error("cannot create " + tmp.string() + ": " + ec.message());
  return tmp.string();
}

Result<std::string> commit_checkpoint_dir(const std::string& checkpoints_dir, const std::string& tmp_dir,
                                          const CheckpointData& data, int64_t optimizer_steps,
                                          const CheckpointOptions& options) {
  const fs::path root(checkpoints_dir), tmp(tmp_dir);
  std::error_code ec;
  const std::string name = "step_" + std::to_string(data.step);
  // 3. checksums of every file, fsync them, then state.json (a sharded checkpoint's shards/ are
  // covered by shards.json, listed here, and were checksummed and fsynced by the ranks that wrote them)
  const bool sharded = fs::exists(tmp / policy::io::kShardManifestFile);
  nlohmann::json files = nlohmann::json::object();
  for (const auto& rel : files_under(tmp)) {
    if (sharded && rel.rfind("shards/", 0) == 0) continue;
    const fs::path p = tmp / rel;
    TROUPE_TRY(fsync_path(p, false));
    TROUPE_ASSIGN_OR_RETURN(uint32_t crc, crc32_of_file(p.string()));
    files[rel] = {{"crc32", hex32(crc)}, {"bytes", fs::file_size(p)}};
  }
  nlohmann::json state = {{"format", "troupe.checkpoint.v1"},
                          {"step", data.step},
                          {"policy_version", data.policy_version},
                          {"optimizer_steps", optimizer_steps},
                          {"trainer", data.trainer_state},
                          {"extra", data.extra},
                          {"files", files}};
  if (data.metric) state["metric"] = {{"name", options.best_metric}, {"value", *data.metric}};
  TROUPE_TRY(write_text_file(tmp / kStateFile, state.dump(2) + "\n"));
  if (sharded) TROUPE_TRY(fsync_path(tmp / "shards", true));
  TROUPE_TRY(fsync_path(tmp, true));

  // 4. rename into place (an older step_N of the same number is replaced)
  const fs::path final_dir = root / name;
  fs::path old;
  if (fs::exists(final_dir)) {
    old = root / (".old_" + name + "." + std::to_string(::getpid()));
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) return io_error("cannot move aside " + final_dir.string() + ": " + ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) return io_error("cannot rename " + tmp.string() + " to " + final_dir.string() + ": " + ec.message());
  TROUPE_TRY(fsync_path(root, true));
  if (!old.empty()) fs::remove_all(old, ec);

  // 5. latest, best
  TROUPE_TRY(swap_symlink(root, "latest", name));
  std::string best_target;
  if (fs::is_symlink(root / "best")) best_target = fs::read_symlink(root / "best", ec).string();
  if (!options.best_metric.empty() && data.metric) {
    bool better = true;
    if (!best_target.empty() && best_target != name) {
      if (auto bv = checkpoint_metric((root / best_target).string()))
        better = options.higher_is_better ? *data.metric > *bv : *data.metric < *bv;
    }
    if (better) {
      TROUPE_TRY(swap_symlink(root, "best", name));
      best_target = name;
    }
  }

  // 6. keep the newest K (and whatever latest/best point to)
  if (options.keep_last > 0) {
    const auto steps = checkpoint_steps(root.string());
    const size_t keep = static_cast<size_t>(options.keep_last);
    for (size_t i = 0; i + keep < steps.size(); ++i) {
      if (steps[i].second == name || steps[i].second == best_target) continue;
      remove_step(root, steps[i].second);
    }
  }
  return final_dir.string();
}

Result<std::string> save_checkpoint(const std::string& checkpoints_dir, const CheckpointData& data,
                                    const ModelDirWriter& write_model, const AdamW& opt,
                                    const std::vector<policy::TensorSpec>& specs, const CheckpointOptions& options) {
  TROUPE_ASSIGN_OR_RETURN(const std::string tmp_dir, begin_checkpoint_dir(checkpoints_dir, data.step, std::to_string(::getpid())));
  const fs::path tmp(tmp_dir);
  // 1. model directory, 2. optimizer moments
  TROUPE_TRY(write_model(tmp.string()));
  {
    policy::io::TensorMap moments;
    auto m = opt.exp_avg();
    auto v = opt.exp_avg_sq();
    for (const auto& s : specs) {
      if (s.offset + s.numel() > m.size())
        return make_error(ErrorCode::internal, "checkpoint: tensor " + s.name + " lies outside the optimizer state");
      auto slice = [&](std::span<const float> buf) {
        return std::vector<float>(buf.begin() + static_cast<std::ptrdiff_t>(s.offset),
                                  buf.begin() + static_cast<std::ptrdiff_t>(s.offset + s.numel()));
      };
      moments["exp_avg." + s.name] = policy::io::Tensor{s.shape, slice(m)};
      moments["exp_avg_sq." + s.name] = policy::io::Tensor{s.shape, slice(v)};
    }
    TROUPE_TRY(policy::io::write_safetensors((tmp / kOptimizerFile).string(), moments,
                                             {{"format", "troupe.adamw.v1"}, {"step", std::to_string(opt.steps())}}));
  }
  return commit_checkpoint_dir(checkpoints_dir, tmp_dir, data, opt.steps(), options);
}

std::vector<std::pair<int64_t, std::string>> checkpoint_steps(const std::string& checkpoints_dir) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(checkpoints_dir, ec)) {
    if (!e.is_directory() || e.is_symlink()) continue;
    auto n = step_of(e.path().filename().string());
    if (n) steps.emplace_back(*n, e.path().filename().string());
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::optional<double> checkpoint_metric(const std::string& step_dir) {
  auto j = read_json_file(fs::path(step_dir) / kStateFile);
  if (!j.ok() || !j->contains("metric") || !(*j)["metric"].is_object() || !(*j)["metric"].contains("value") ||
      !(*j)["metric"]["value"].is_number())
    return std::nullopt;
  return (*j)["metric"]["value"].get<double>();
}

Result<std::string> latest_checkpoint(const std::string& checkpoints_dir) {
  const fs::path link = fs::path(checkpoints_dir) / "latest";
  std::error_code ec;
  if (!fs::is_symlink(link, ec)) return invalid_input("checkpoint: no " + link.string() + " (nothing saved yet?)");
  const fs::path target = fs::path(checkpoints_dir) / fs::read_symlink(link, ec);
  if (ec || !fs::is_directory(target)) return invalid_input("checkpoint: " + link.string() + " points to a missing directory");
  return target.string();
}

namespace {

// A file state.json lists: a relative path inside the step directory (no "..", not absolute, not
// empty) naming a regular file. An error names state.json and the entry.
Result<fs::path> listed_file(const fs::path& dir, const std::string& key, const std::string& sfile) {
  const fs::path rel(key);
  bool inside = !key.empty() && key.size() < 1024 && key.find('\0') == std::string::npos && rel.is_relative();
  for (const auto& part : rel)
    if (part == ".." || part == ".") inside = false;
  if (!inside)
    return invalid_input("checkpoint: " + sfile + " lists '" + key.substr(0, 200) +
                         "', which is not a relative path inside the checkpoint directory");
  const fs::path p = dir / rel;
  std::error_code ec;
  const auto st = fs::symlink_status(p, ec);
  if (ec || !fs::exists(st)) return invalid_input("checkpoint: " + p.string() + " is missing (listed in " + sfile + ")");
  if (!fs::is_regular_file(st))
    return invalid_input("checkpoint: " + p.string() + " (listed in " + sfile + ") is not a regular file");
  return p;
}

}  // namespace

namespace {

// verify_checkpoint's checks; the bytes (CRC-32, xxh3) only of the files whose index is part mod
// parts (parts 0: none, 1: all).
Result<nlohmann::json> check_checkpoint(const std::string& step_dir, int part, int parts) {
  const fs::path dir(step_dir);
  TROUPE_ASSIGN_OR_RETURN(auto state, read_json_file(dir / kStateFile));
  const std::string sfile = (dir / kStateFile).string();
  if (!state.is_object() || !state.contains("files") || !state["files"].is_object() || !state.contains("step") ||
      !state["step"].is_number_integer())
    return invalid_input("checkpoint: " + sfile + " lacks 'files' or an integer 'step'");
  // a whole checkpoint has its weights (a LoRA run's: the adapter) and its optimizer moments, whatever
  // else it holds; a sharded one has both in the shards its shards.json lists
  const bool sharded = state["files"].contains(policy::io::kShardManifestFile);
  if (!sharded && !state["files"].contains("model.safetensors") && !state["files"].contains("adapter_model.safetensors"))
    return invalid_input("checkpoint: " + sfile + " does not list model.safetensors (nor a LoRA run's adapter_model.safetensors, nor a sharded run's shards.json): not a whole checkpoint");
  if (!sharded && !state["files"].contains(kOptimizerFile))
    return invalid_input("checkpoint: " + sfile + " does not list " + std::string(kOptimizerFile) + ": not a whole checkpoint");
  size_t index = 0;
  for (auto it = state["files"].begin(); it != state["files"].end(); ++it, ++index) {
    TROUPE_ASSIGN_OR_RETURN(const fs::path p, listed_file(dir, it.key(), sfile));
    const auto& e = it.value();
    if (!e.is_object() || !e.contains("crc32") || !e["crc32"].is_string() || !e.contains("bytes") ||
        !e["bytes"].is_number_unsigned())
      return invalid_input("checkpoint: " + sfile + ": bad entry for " + it.key());
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec) return invalid_input("checkpoint: cannot read the size of " + p.string() + ": " + ec.message());
    if (size != e["bytes"].get<uint64_t>())
      return invalid_input("checkpoint: " + p.string() + " has " + std::to_string(size) + " bytes, " + sfile +
                           " says " + std::to_string(e["bytes"].get<uint64_t>()) + ": the file is truncated or corrupt");
    if (parts == 0 || static_cast<int>(index % static_cast<size_t>(parts)) != part) continue;
    TROUPE_ASSIGN_OR_RETURN(uint32_t crc, crc32_of_file(p.string()));
    if (hex32(crc) != e["crc32"].get<std::string>())
      return invalid_input("checkpoint: " + p.string() + " fails its checksum (crc32 " + hex32(crc) + ", expected " +
                           e["crc32"].get<std::string>() + "): the file is corrupt");
  }
  if (sharded) {  // every rank's file (the error names the file and the rank)
    TROUPE_ASSIGN_OR_RETURN(auto m, policy::io::read_shard_manifest(step_dir));
    for (const char* b : {"params", "exp_avg", "exp_avg_sq"})
      if (std::find(m.buffers.begin(), m.buffers.end(), b) == m.buffers.end())
        return invalid_input("checkpoint: " + m.path + " lists no '" + b + "' buffer: not a whole checkpoint");
    if (parts > 0) TROUPE_TRY(policy::io::verify_shard_files(step_dir, m, part, parts));
  }
  for (const char* key : {"policy_version", "optimizer_steps"})
    if (state.contains(key) && !state[key].is_number_integer())
      return invalid_input("checkpoint: " + sfile + ": '" + key + "' is not an integer: " + state[key].dump().substr(0, 100));
  if (state.contains("metric") && !(state["metric"].is_object() && state["metric"].contains("value") &&
                                    (state["metric"]["value"].is_number() || state["metric"]["value"].is_null())))
    return invalid_input("checkpoint: " + sfile + ": 'metric' is not {value: a number}: " + state["metric"].dump().substr(0, 100));
  return state;
}

}  // namespace

Result<nlohmann::json> verify_checkpoint(const std::string& step_dir) { return check_checkpoint(step_dir, 0, 1); }

Result<nlohmann::json> check_checkpoint_listing(const std::string& step_dir) { return check_checkpoint(step_dir, 0, 0); }

Result<nlohmann::json> verify_checkpoint_part(const std::string& step_dir, int part, int parts) {
  if (parts < 1 || part < 0 || part >= parts)
    return invalid_input("checkpoint: part " + std::to_string(part) + " of " + std::to_string(parts));
  return check_checkpoint(step_dir, part, parts);
}

CheckpointData checkpoint_data(const nlohmann::json& state, AdamW& opt) {
  CheckpointData d;
  d.step = state["step"].get<int64_t>();
  d.policy_version = state.value("policy_version", int64_t{0});
  opt.set_steps(state.value("optimizer_steps", int64_t{0}));
  if (state.contains("trainer")) d.trainer_state = state["trainer"];
  if (state.contains("extra")) d.extra = state["extra"];
  if (state.contains("metric") && state["metric"]["value"].is_number())  // else a NaN, saved as null
    d.metric = state["metric"]["value"].get<double>();
  return d;
}

namespace {

// optimizer.safetensors: both moments of every tensor, by name.
// The moments [begin, begin + opt.size()) of a buffer of `total` values from optimizer.safetensors,
// tensor by tensor (each tensor that overlaps them read, its overlap kept).
Status load_whole_moments(const fs::path& dir, const std::vector<policy::TensorSpec>& specs, AdamW& opt, size_t begin,
                          size_t total) {
  TROUPE_ASSIGN_OR_RETURN(auto file, policy::io::SafetensorsFile::open((dir / kOptimizerFile).string()));
  const size_t end = begin + opt.size();
  for (const auto& s : specs) {
    if (s.offset + s.numel() > total)
      return invalid_input("checkpoint: tensor " + s.name + " lies outside the optimizer of " + std::to_string(total) +
                           " parameters");
    const size_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel());
    if (lo >= hi) continue;
    TROUPE_ASSIGN_OR_RETURN(auto m, file.read("exp_avg." + s.name, shape_of(s)));
    TROUPE_ASSIGN_OR_RETURN(auto v, file.read("exp_avg_sq." + s.name, shape_of(s)));
    const auto from = static_cast<std::ptrdiff_t>(lo - s.offset), to = static_cast<std::ptrdiff_t>(hi - s.offset);
    const auto at = static_cast<std::ptrdiff_t>(lo - begin);
    std::copy(m.data.begin() + from, m.data.begin() + to, opt.exp_avg().begin() + at);
    std::copy(v.data.begin() + from, v.data.begin() + to, opt.exp_avg_sq().begin() + at);
  }
  return {};
}

// A sharded checkpoint's moments: its table must be the model's (names, shapes, offsets), then the
// flat exp_avg and exp_avg_sq values [begin, begin + opt.size()) are read from the rank files that
// hold them, whatever their layout.
Status load_sharded_moments(const fs::path& dir, const std::vector<policy::TensorSpec>& specs, AdamW& opt, size_t begin,
                            size_t total) {
  TROUPE_ASSIGN_OR_RETURN(auto m, policy::io::read_shard_manifest(dir.string()));
  TROUPE_TRY(policy::io::check_shard_table(m, specs, "the model"));
  if (m.numel() != total)
    return invalid_input("checkpoint: " + m.path + " holds " + std::to_string(m.numel()) + " values, the optimizer " +
                         std::to_string(total));
  const size_t end = begin + opt.size();
  TROUPE_ASSIGN_OR_RETURN(auto ea, policy::io::read_shard_buffer(dir.string(), m, "exp_avg", begin, end));
  std::copy(ea.begin(), ea.end(), opt.exp_avg().begin());
  ea = {};
  TROUPE_ASSIGN_OR_RETURN(auto eb, policy::io::read_shard_buffer(dir.string(), m, "exp_avg_sq", begin, end));
  std::copy(eb.begin(), eb.end(), opt.exp_avg_sq().begin());
  return {};
}

}  // namespace

Result<CheckpointData> load_checkpoint(const std::string& step_dir, const std::vector<policy::TensorSpec>& specs,
                                       AdamW& opt) {
  if (opt.size() == 0 && !specs.empty()) opt = AdamW(specs.back().offset + specs.back().numel());
  return load_checkpoint_share(step_dir, specs, 0, opt.size(), opt);
}

Result<CheckpointData> load_checkpoint_share(const std::string& step_dir, const std::vector<policy::TensorSpec>& specs,
                                             size_t begin, size_t total, AdamW& opt) {
  const fs::path dir(step_dir);
  TROUPE_ASSIGN_OR_RETURN(auto state, verify_checkpoint(step_dir));
  if (begin + opt.size() > total)
    return invalid_input("checkpoint: asked for moments [" + std::to_string(begin) + ", " +
                         std::to_string(begin + opt.size()) + ") of a buffer of " + std::to_string(total));
  if (state["files"].contains(policy::io::kShardManifestFile)) {
    TROUPE_TRY(load_sharded_moments(step_dir, specs, opt, begin, total));
  } else {
    TROUPE_TRY(load_whole_moments(step_dir, specs, opt, begin, total));
  }
  return checkpoint_data(state, opt);
}

}  // namespace troupe::learner
