// Checkpoints: checkpoints/step_N/ = a model directory (config.json + model.safetensors [+ tokenizer])
// + optimizer.safetensors (AdamW moments, named like the parameters) + state.json (step, policy
// version, trainer RNG, the coordinator's JSON, and a CRC32 + size of every other file).
// Invariant: a step_N that exists is complete: it is written under a temporary name, every file and
// the directory are fsynced, then renamed; `latest` (and `best`) are symlinks replaced by rename.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/base/result.h"
#include "troupe/learner/optimizer.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/policy/model.h"

namespace troupe::learner {

inline constexpr const char* kOptimizerFile = "optimizer.safetensors";  // a whole checkpoint's AdamW moments

struct CheckpointOptions {
  int keep_last = 3;            // keep the K newest step_N (0 = keep all); `best` is always kept
  std::string best_metric;      // non-empty: maintain checkpoints/best -> the step with the best metric
  bool higher_is_better = true;
};

struct CheckpointData {
  int64_t step = 0;
  int64_t policy_version = 0;
  nlohmann::json trainer_state = nlohmann::json::object();  // Trainer::state_json()
  nlohmann::json extra = nlohmann::json::object();          // the coordinator's: data cursors, RNGs, ...
  std::optional<double> metric;                             // value of best_metric at this step
};

// Writes the model directory's files into `dir` (which exists). The learner actor passes one that
// calls policy::io::save_model_dir; flat_model_writer() is the minimal one.
using ModelDirWriter = std::function<Status(const std::string& dir)>;

// model.safetensors from the flat parameters and their tensor table, and config.json = config_json.
ModelDirWriter flat_model_writer(std::span<const float> params, const std::vector<policy::TensorSpec>& specs,
                                 nlohmann::json config_json);
// The real policy model's directory through policy::io::save_model (config.json, HF-layout
// model.safetensors, the tokenizer when given). The model and tokenizer must outlive the writer.
ModelDirWriter policy_model_writer(const policy::Model& model, const policy::io::Tokenizer* tokenizer = nullptr,
                                   int32_t bos_token_id = -1, int32_t eos_token_id = -1, int32_t pad_token_id = -1);
// Loads a checkpoint's model directory (policy::io::load_model) and copies its weights into `model`;
// errors when the directory's tensor table differs from the model's (names, shapes).
Status load_policy_model_params(const std::string& dir, policy::Model& model);

// Reads dir/model.safetensors into params, checking every name and shape of the table.
Status read_flat_model(const std::string& dir, const std::vector<policy::TensorSpec>& specs, std::span<float> params);

// Saves checkpoints_dir/step_<data.step>, switches `latest`, updates `best`, prunes old steps.
// Returns the final directory. Under data parallelism call it on rank 0 only: parameters and AdamW
// moments are identical on every rank (the gradients are all-reduced before each step).
Result<std::string> save_checkpoint(const std::string& checkpoints_dir, const CheckpointData& data,
                                    const ModelDirWriter& write_model, const AdamW& opt,
                                    const std::vector<policy::TensorSpec>& specs, const CheckpointOptions& options);

// save_checkpoint's two halves, for a save whose files several processes write (sharded learners,
// sharded_checkpoint.h). begin: removes what a killed save left in checkpoints_dir and makes the
// empty temporary directory .tmp_step_<step>.<tag> (returned). commit: lists every file of it in
// state.json with its CRC-32 and size (not those under shards/ when it has a shards.json, which
// lists them), fsyncs, renames it to step_<step>, switches latest/best, prunes old steps.
Result<std::string> begin_checkpoint_dir(const std::string& checkpoints_dir, int64_t step, const std::string& tag);
Result<std::string> commit_checkpoint_dir(const std::string& checkpoints_dir, const std::string& tmp_dir,
                                          const CheckpointData& data, int64_t optimizer_steps,
                                          const CheckpointOptions& options);

// The step_N directories of checkpoints_dir (not the latest/best links), ascending by N.
std::vector<std::pair<int64_t, std::string>> checkpoint_steps(const std::string& checkpoints_dir);

// The best_metric value a checkpoint was saved with (its state.json only; none when absent).
std::optional<double> checkpoint_metric(const std::string& step_dir);

// The directory `latest` points to (error when there is none).
Result<std::string> latest_checkpoint(const std::string& checkpoints_dir);

// Checks a step directory without loading it: state.json parses and has an integer step, and every
// file it lists exists with its size and CRC-32 (an error names the bad file); a sharded checkpoint's
// shards too, against shards.json's sizes and xxh3 (the error names the file and its rank). Returns state.json.
// The launcher calls it before a --resume touches the run directory.
Result<nlohmann::json> verify_checkpoint(const std::string& step_dir);
// verify_checkpoint's checks without reading any file's bytes (sizes, not checksums): for a reader
// of a part of a checkpoint that verify_checkpoint passed before (load_checkpoint_ranges).
Result<nlohmann::json> check_checkpoint_listing(const std::string& step_dir);
// verify_checkpoint with the reading shared among `parts` readers (the ranks of a job): this one,
// `part`, makes every check but reads (CRC-32, and a shard's xxh3) only the listed files whose index
// in state.json's listing (sorted by path), or in shards.json, is `part` mod `parts`. Together the
// parts read each file's bytes once; a bad file fails the part that read it.
Result<nlohmann::json> verify_checkpoint_part(const std::string& step_dir, int part, int parts);
// The CheckpointData of a checked state.json (step, policy_version, trainer, extra, metric); sets
// opt's optimizer step count.
CheckpointData checkpoint_data(const nlohmann::json& state, AdamW& opt);

// Verifies the checksum and size of every file state.json lists (an error names the bad file), loads
// the AdamW moments into opt (names and shapes checked against specs) and returns the state.
// The model weights are read separately (read_flat_model or policy::io::load_model_dir).
Result<CheckpointData> load_checkpoint(const std::string& step_dir, const std::vector<policy::TensorSpec>& specs,
                                       AdamW& opt);
// The same for one sharded learner's share: only the moments' values [begin, begin + share.size())
// of the flat buffer of `total` values go into `share` (a sharded checkpoint's rank files that hold
// them, whatever their number; an unsharded one's tensors that overlap them, one at a time), so a
// rank never holds the whole moments.
Result<CheckpointData> load_checkpoint_share(const std::string& step_dir, const std::vector<policy::TensorSpec>& specs,
                                             size_t begin, size_t total, AdamW& share);

// fsync(2) of a file (an error names it).
Status fsync_file(const std::string& path);

// CRC-32 (IEEE 802.3, as zlib's crc32) of a file's bytes.
Result<uint32_t> crc32_of_file(const std::string& path);
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);

}  // namespace troupe::learner
