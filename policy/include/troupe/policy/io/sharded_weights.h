// Sharded weights (a sharded learner's checkpoint): shards.json names the layout -- world size,
// the flat buffer's shard bounds, the tensor table (names, shapes, flat offsets) -- and one file
// per rank, shards/rank_R.safetensors, holding that rank's slice [begin, end) of each flat buffer
// (params, exp_avg, exp_avg_sq) as 1-D tensors. Invariant: a value is read only from a file whose
// size and xxh3-64 match the manifest (a ShardRangeReader without `hash`: whose size does, the xxh3
// having been checked before); every error names the file and the rank that wrote it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/policy/io/safetensors.h"
#include "troupe/policy/model.h"

namespace troupe::policy::io {

inline constexpr const char* kShardManifestFile = "shards.json";
inline constexpr const char* kShardManifestFormat = "troupe.shards.v1";
inline constexpr const char* kShardParams = "params";  // the flat buffer every sharded checkpoint has

struct ShardFile {
  int rank = 0;
  std::string path;  // relative to the checkpoint directory: shards/rank_R.safetensors
  size_t begin = 0, end = 0;  // the rank's slice of every flat buffer
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;  // of the file's bytes
};

struct ShardManifest {
  // "model": params is the whole model's flat buffer (Model::tensors(), Hugging Face names);
  // "lora_adapter": the adapters' (PEFT names), the base being base.json's.
  std::string kind = "model";
  std::string stage;               // learner.shard of the run that wrote it (informative)
  // How the buffer was cut (informative): "" = the learners' shard bounds, file R written by learner
  // rank R; "expert_runs E" = divided experts (policy.moe.expert_parallel E): file R is run R of the
  // weight sync's runs, written by the learner that holds it.
  std::string layout;
  int world_size = 1;
  std::vector<size_t> bounds;      // world_size + 1 offsets, 0 .. numel
  std::vector<TensorSpec> tensors; // the table over params
  std::vector<std::string> buffers = {kShardParams};  // the flat buffers each file holds
  std::vector<ShardFile> files;    // one per rank, in rank order
  std::string path;                // where it was read from ("" when built in memory)
  size_t numel() const { return bounds.empty() ? 0 : bounds.back(); }
};

// dir/shards.json exists.
bool has_shard_manifest(const std::string& dir);
// Reads and checks dir/shards.json (bounds ascending from 0, one file per rank with its bounds,
// every tensor inside the buffer); errors name the file and the key.
Result<ShardManifest> read_shard_manifest(const std::string& dir);
// Writes dir/shards.json (fsync is the caller's).
Status write_shard_manifest(const std::string& dir, const ShardManifest& m);

// Rank `rank`'s file dir/shards/rank_R.safetensors: buffers[name] are its slices (end - begin
// values each). Returns the manifest entry (bytes, xxh3 of what was written).
Result<ShardFile> write_shard_file(const std::string& dir, int rank, int world_size, size_t begin, size_t end,
                                   const std::map<std::string, std::span<const float>>& buffers);
// xxh3-64 of a file's bytes.
Result<uint64_t> xxh3_of_file(const std::string& path);

// Every file's size and xxh3 against the manifest (the error names the file and its rank). With
// parts > 1 only the files whose index in the manifest is `part` mod `parts` (several readers
// sharing the work, each byte read by one of them).
Status verify_shard_files(const std::string& dir, const ShardManifest& m, int part = 0, int parts = 1);
// Values [begin, end) of flat buffer `buffer`, read from the files that hold them (each verified).
Result<std::vector<float>> read_shard_buffer(const std::string& dir, const ShardManifest& m, const std::string& buffer,
                                             size_t begin, size_t end);
// Ranges of a sharded checkpoint's flat buffers, read range by range from the files that hold them
// (each file opened once, on first use, DataLoad::on_demand: only the ranges' bytes are read). A file
// is checked against the manifest's size when opened, and with `hash` its xxh3 (a streaming pass
// over its bytes, as verify_shard_files makes; without it, for a checkpoint verified before, such as
// `troupe run --resume`'s, only the ranges' bytes are read); errors name the file and its rank. The
// files no range touches are not opened.
class ShardRangeReader {
 public:
  ShardRangeReader(std::string dir, ShardManifest m, bool hash);
  const ShardManifest& manifest() const { return m_; }
  // Values [begin, begin + out.size()) of flat buffer `buffer` into `out`.
  Status read(const std::string& buffer, size_t begin, std::span<float> out);

 private:
  std::string dir_;
  ShardManifest m_;
  bool hash_ = false;
  std::vector<std::optional<SafetensorsFile>> files_;  // opened on first use, in the manifest's order
};

// The manifest's table equals `table` (names, shapes, offsets, in order); `what` names the model
// in the error, which names the first difference.
Status check_shard_table(const ShardManifest& m, std::span<const TensorSpec> table, const std::string& what);
// The params buffer, whole, as tensors under the table's names (for load_model_dir and PEFT readers).
Result<TensorMap> read_sharded_tensors(const std::string& dir, const ShardManifest& m);

}  // namespace troupe::policy::io
