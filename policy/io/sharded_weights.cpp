// Sharded weights (sharded_weights.h): shards.json and the per-rank files of a sharded learner's
// checkpoint, written by each rank and read back whole or by range. Invariant: no value is used
// from a file whose size or xxh3 differs from the manifest's (a ShardRangeReader without `hash` checks
// the size and leaves the xxh3 to verify_shard_files, run before), and every error names file and rank.
#include "troupe/policy/io/sharded_weights.h"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace troupe::policy::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

std::string shard_name(int rank) { return "shards/rank_" + std::to_string(rank) + ".safetensors"; }

std::string who(const ShardFile& f, const ShardManifest& m, const std::string& dir) {
  return (fs::path(dir) / f.path).string() + " (rank " + std::to_string(f.rank) + " of " +
         std::to_string(m.world_size) + ")";
}

// A non-negative integer at j[key] (error names the file and the key).
Result<uint64_t> count_at(const json& j, const char* key, const std::string& file) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_unsigned())
    return invalid_input(file + ": '" + key + "' is missing or not a non-negative integer");
  return j[key].get<uint64_t>();
}

Result<std::vector<TensorSpec>> table_from_json(const json& j, const std::string& file, size_t numel) {
  if (!j.is_array()) return invalid_input(file + ": 'tensors' is not a list");
  std::vector<TensorSpec> out;
  for (const auto& t : j) {
    TensorSpec s;
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("shape") || !t["shape"].is_array())
      return invalid_input(file + ": an entry of 'tensors' lacks 'name' or 'shape'");
    s.name = t["name"].get<std::string>();
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned()) return invalid_input(file + ": tensor '" + s.name + "' has a bad shape");
      s.shape.push_back(d.get<int64_t>());
    }
    TROUPE_ASSIGN_OR_RETURN(uint64_t off, count_at(t, "offset", file + ": tensor '" + s.name + "'"));
    s.offset = off;
    if (s.offset + s.numel() > numel)
      return invalid_input(file + ": tensor '" + s.name + "' lies outside the buffer of " + std::to_string(numel) + " values");
    out.push_back(std::move(s));
  }
  return out;
}

Result<ShardFile> file_from_json(const json& f, const std::string& file) {
  ShardFile s;
  if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("xxh3") || !f["xxh3"].is_string())
    return invalid_input(file + ": an entry of 'files' lacks 'path' or 'xxh3'");
  s.path = f["path"].get<std::string>();
  TROUPE_ASSIGN_OR_RETURN(uint64_t rank, count_at(f, "rank", file));
  TROUPE_ASSIGN_OR_RETURN(s.begin, count_at(f, "begin", file));
  TROUPE_ASSIGN_OR_RETURN(s.end, count_at(f, "end", file));
  TROUPE_ASSIGN_OR_RETURN(s.bytes, count_at(f, "bytes", file));
  s.rank = static_cast<int>(rank);
  const std::string x = f["xxh3"].get<std::string>();
  char* end = nullptr;
  s.xxh3 = std::strtoull(x.c_str(), &end, 16);
  if (x.size() != 16 || !end || *end != '\0') return invalid_input(file + ": 'xxh3' of " + s.path + " is not 16 hex digits");
  const fs::path rel(s.path);
  bool inside = rel.is_relative() && !s.path.empty();
  for (const auto& part : rel) inside = inside && part != ".." && part != ".";
  if (!inside) return invalid_input(file + ": '" + s.path.substr(0, 200) + "' is not a path inside the checkpoint");
  return s;
}

}  // namespace

bool has_shard_manifest(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kShardManifestFile, ec);
}

Result<ShardManifest> read_shard_manifest(const std::string& dir) {
  const std::string file = (fs::path(dir) / kShardManifestFile).string();
  std::ifstream in(file);
  if (!in) return invalid_input(file + ": cannot open");
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_input(file + ": not a JSON object");
  if (j.value("format", std::string()) != kShardManifestFormat)
    return invalid_input(file + ": 'format' is not " + std::string(kShardManifestFormat));
  ShardManifest m;
  m.path = file;
  m.kind = j.value("kind", std::string());
  if (m.kind != "model" && m.kind != "lora_adapter") return invalid_input(file + ": 'kind' is not model or lora_adapter");
  m.stage = j.value("stage", std::string());
  m.layout = j.value("layout", std::string());
  TROUPE_ASSIGN_OR_RETURN(uint64_t world, count_at(j, "world_size", file));
  if (world < 1 || world > (1u << 20)) return invalid_input(file + ": 'world_size' " + std::to_string(world) + " is out of range");
  m.world_size = static_cast<int>(world);
  if (!j.contains("bounds") || !j["bounds"].is_array() || j["bounds"].size() != world + 1)
    return invalid_input(file + ": 'bounds' is not a list of world_size + 1 offsets");
  for (const auto& b : j["bounds"]) {
    if (!b.is_number_unsigned() || (!m.bounds.empty() && b.get<size_t>() < m.bounds.back()) || (m.bounds.empty() && b.get<size_t>() != 0))
      return invalid_input(file + ": 'bounds' are not ascending offsets from 0");
    m.bounds.push_back(b.get<size_t>());
  }
  TROUPE_ASSIGN_OR_RETURN(m.tensors, table_from_json(j.value("tensors", json()), file, m.numel()));
  if (!j.contains("buffers") || !j["buffers"].is_array()) return invalid_input(file + ": 'buffers' is not a list");
  m.buffers.clear();
  for (const auto& b : j["buffers"])
    if (b.is_string()) m.buffers.push_back(b.get<std::string>());
  if (!j.contains("files") || !j["files"].is_array() || j["files"].size() != world)
    return invalid_input(file + ": 'files' does not list one file per rank (world_size " + std::to_string(world) + ")");
  for (const auto& f : j["files"]) {
    TROUPE_ASSIGN_OR_RETURN(auto s, file_from_json(f, file));
    const auto r = static_cast<size_t>(m.files.size());
    if (s.rank != static_cast<int>(r) || s.begin != m.bounds[r] || s.end != m.bounds[r + 1])
      return invalid_input(file + ": the file of rank " + std::to_string(r) + " (" + s.path +
                           ") does not hold that rank's bounds");
    m.files.push_back(std::move(s));
  }
  return m;
}

Status write_shard_manifest(const std::string& dir, const ShardManifest& m) {
  json tensors = json::array(), files = json::array();
  for (const auto& s : m.tensors) tensors.push_back({{"name", s.name}, {"shape", s.shape}, {"offset", s.offset}});
  for (const auto& f : m.files)
    files.push_back({{"rank", f.rank}, {"path", f.path}, {"begin", f.begin}, {"end", f.end}, {"bytes", f.bytes},
                     {"xxh3", hex64(f.xxh3)}});
  json j = {{"format", kShardManifestFormat}, {"kind", m.kind},       {"stage", m.stage},
            {"world_size", m.world_size},      {"bounds", m.bounds},   {"numel", m.numel()},
            {"buffers", m.buffers},            {"tensors", tensors},   {"files", files}};
  if (!m.layout.empty()) j["layout"] = m.layout;
  const fs::path p = fs::path(dir) / kShardManifestFile;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << j.dump(1) << "\n";
  if (!out.flush()) return make_error(ErrorCode::io, p.string() + ": write failed");
  return {};
}

Result<uint64_t> xxh3_of_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return invalid_input(path + ": cannot read");
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    XXH3_64bits_update(st, buf.data(), static_cast<size_t>(f.gcount()));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

Result<ShardFile> write_shard_file(const std::string& dir, int rank, int world_size, size_t begin, size_t end,
                                   const std::map<std::string, std::span<const float>>& buffers) {
  ShardFile f;
  f.rank = rank;
  f.path = shard_name(rank);
  f.begin = begin;
  f.end = end;
  TensorMap t;
  for (const auto& [name, values] : buffers) {
    if (values.size() != end - begin)
      return make_error(ErrorCode::internal, "write_shard_file: buffer " + name + " has " + std::to_string(values.size()) +
                                                 " values for the slice [" + std::to_string(begin) + ", " +
                                                 std::to_string(end) + ")");
    t[name] = Tensor{{static_cast<int64_t>(values.size())}, std::vector<float>(values.begin(), values.end())};
  }
  const fs::path p = fs::path(dir) / f.path;
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  if (ec) return make_error(ErrorCode::io, p.parent_path().string() + ": cannot create (" + ec.message() + ")");
  TROUPE_TRY(write_safetensors(p.string(), t,
                               {{"format", "troupe.shard.v1"}, {"rank", std::to_string(rank)},
                                {"world_size", std::to_string(world_size)}, {"begin", std::to_string(begin)},
                                {"end", std::to_string(end)}}));
  f.bytes = fs::file_size(p, ec);
  if (ec) return make_error(ErrorCode::io, p.string() + ": cannot read its size (" + ec.message() + ")");
  TROUPE_ASSIGN_OR_RETURN(f.xxh3, xxh3_of_file(p.string()));
  return f;
}

namespace {

// The file is there with the manifest's size (no byte of it read).
Status check_size(const std::string& dir, const ShardManifest& m, const ShardFile& f) {
  const fs::path p = fs::path(dir) / f.path;
  std::error_code ec;
  if (!fs::is_regular_file(p, ec))
    return invalid_input("sharded checkpoint: " + who(f, m, dir) + " is missing (listed in " + m.path + ")");
  const auto size = fs::file_size(p, ec);
  if (ec || size != f.bytes)
    return invalid_input("sharded checkpoint: " + who(f, m, dir) + " has " + std::to_string(size) + " bytes, " +
                         kShardManifestFile + " says " + std::to_string(f.bytes) + ": the file is truncated or corrupt");
  return {};
}

Status verify_one(const std::string& dir, const ShardManifest& m, const ShardFile& f) {
  TROUPE_TRY(check_size(dir, m, f));
  const fs::path p = fs::path(dir) / f.path;
  TROUPE_ASSIGN_OR_RETURN(uint64_t h, xxh3_of_file(p.string()));
  if (h != f.xxh3)
    return invalid_input("sharded checkpoint: " + who(f, m, dir) + " fails its checksum (xxh3 " + hex64(h) +
                         ", expected " + hex64(f.xxh3) + "): the file is corrupt");
  return {};
}

}  // namespace

Status verify_shard_files(const std::string& dir, const ShardManifest& m, int part, int parts) {
  for (size_t i = 0; i < m.files.size(); ++i)
    if (parts <= 1 || static_cast<int>(i % static_cast<size_t>(parts)) == part) TROUPE_TRY(verify_one(dir, m, m.files[i]));
  return {};
}

Result<std::vector<float>> read_shard_buffer(const std::string& dir, const ShardManifest& m, const std::string& buffer,
                                             size_t begin, size_t end) {
  if (begin > end || end > m.numel())
    return invalid_input(m.path + ": asked for values [" + std::to_string(begin) + ", " + std::to_string(end) +
                         ") of a buffer of " + std::to_string(m.numel()));
  std::vector<float> out(end - begin);
  for (const auto& f : m.files) {
    const size_t lo = std::max(begin, f.begin), hi = std::min(end, f.end);
    if (lo >= hi) continue;
    TROUPE_TRY(verify_one(dir, m, f));
    const std::string path = (fs::path(dir) / f.path).string();
    TROUPE_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
    auto t = file.read(buffer, {static_cast<int64_t>(f.end - f.begin)});
    if (!t.ok()) return invalid_input("sharded checkpoint: " + who(f, m, dir) + ": " + t.error().message);
    std::copy(t->data.begin() + static_cast<std::ptrdiff_t>(lo - f.begin),
              t->data.begin() + static_cast<std::ptrdiff_t>(hi - f.begin), out.begin() + static_cast<std::ptrdiff_t>(lo - begin));
  }
  return out;
}

ShardRangeReader::ShardRangeReader(std::string dir, ShardManifest m, bool hash)
    : dir_(std::move(dir)), m_(std::move(m)), hash_(hash), files_(m_.files.size()) {}

Status ShardRangeReader::read(const std::string& buffer, size_t begin, std::span<float> out) {
  const size_t end = begin + out.size();
  if (begin > end || end > m_.numel())
    return invalid_input(m_.path + ": asked for values [" + std::to_string(begin) + ", " + std::to_string(end) +
                         ") of a buffer of " + std::to_string(m_.numel()));
  for (size_t i = 0; i < m_.files.size(); ++i) {
    const ShardFile& f = m_.files[i];
    const size_t lo = std::max(begin, f.begin), hi = std::min(end, f.end);
    if (lo >= hi) continue;
    if (!files_[i]) {
      TROUPE_TRY(hash_ ? verify_one(dir_, m_, f) : check_size(dir_, m_, f));
      auto opened = SafetensorsFile::open((fs::path(dir_) / f.path).string(), DataLoad::on_demand);
      if (!opened.ok()) return invalid_input("sharded checkpoint: " + who(f, m_, dir_) + ": " + opened.error().message);
      const SafetensorsEntry* e = opened->find(buffer);
      if (e && e->shape != std::vector<int64_t>{static_cast<int64_t>(f.end - f.begin)})
        return invalid_input("sharded checkpoint: " + who(f, m_, dir_) + ": tensor '" + buffer + "' has shape " +
                             shape_string(e->shape) + ", its slice [" + std::to_string(f.begin) + ", " +
                             std::to_string(f.end) + ") needs (" + std::to_string(f.end - f.begin) + ",)");
      files_[i] = std::move(opened).value();
    }
    Status st = files_[i]->read_flat(buffer, lo - f.begin, out.subspan(lo - begin, hi - lo));
    if (!st.ok()) return invalid_input("sharded checkpoint: " + who(f, m_, dir_) + ": " + st.error().message);
  }
  return {};
}

Status check_shard_table(const ShardManifest& m, std::span<const TensorSpec> table, const std::string& what) {
  const size_t n = std::min(m.tensors.size(), table.size());
  for (size_t i = 0; i < n; ++i) {
    const auto &a = m.tensors[i], &b = table[i];
    if (a.name != b.name || a.shape != b.shape || a.offset != b.offset)
      return invalid_input(m.path + ": tensor " + std::to_string(i) + " is " + a.name + " " + shape_string(a.shape) +
                           " at offset " + std::to_string(a.offset) + ", but " + what + " has " + b.name + " " +
                           shape_string(b.shape) + " at offset " + std::to_string(b.offset) +
                           " (the checkpoint is of another model)");
  }
  if (m.tensors.size() != table.size())
    return invalid_input(m.path + ": lists " + std::to_string(m.tensors.size()) + " tensors, " + what + " has " +
                         std::to_string(table.size()) + " (the checkpoint is of another model)");
  return {};
}

Result<TensorMap> read_sharded_tensors(const std::string& dir, const ShardManifest& m) {
  TROUPE_ASSIGN_OR_RETURN(auto flat, read_shard_buffer(dir, m, kShardParams, 0, m.numel()));
  TensorMap out;
  for (const auto& s : m.tensors) {
    const auto b = flat.begin() + static_cast<std::ptrdiff_t>(s.offset);
    out[s.name] = Tensor{s.shape, std::vector<float>(b, b + static_cast<std::ptrdiff_t>(s.numel()))};
  }
  return out;
}

}  // namespace troupe::policy::io
