// Sharded learners' checkpoints (learner.shard other than none): every rank writes its own shard of
// the trainable flat buffer and of both AdamW moments, in parallel, into checkpoints/step_N/shards/;
// learner 0 adds the model's other files and shards.json (the layout, policy/io/sharded_weights.h).
// Invariant: step_N appears (one rename) only once every rank's file is written, fsynced and
// checksummed, so a kill at any point leaves `latest` on a whole step.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/learner/communicator.h"
#include "troupe/policy/model.h"

namespace troupe::learner {

// What one rank holds: its shard [bounds[rank], bounds[rank + 1]) of the trainable buffer and of
// the moments (the same bounds, table and kind on every rank); or, with `pieces` (divided experts),
// the pieces of `bounds` it writes, any number per rank (each piece written by one rank).
struct RankShard {
  std::span<const float> params, exp_avg, exp_avg_sq;  // each bounds[rank + 1] - bounds[rank] values
  std::span<const size_t> bounds;                     // comm.size() + 1 offsets (pieced: pieces + 1)
  const std::vector<policy::TensorSpec>* specs = nullptr;  // the trainable buffer's table
  std::string kind = "model";                         // "model" or "lora_adapter" (the adapters alone)
  std::string stage;                                  // learner.shard, recorded in shards.json
  int64_t optimizer_steps = 0;
  // Pieced (divided experts): the files are the pieces of `bounds`, each written by one rank; this
  // rank writes `pieces` (maybe none), the spans above unused.
  bool pieced = false;
  struct Piece {
    size_t index = 0;  // piece [bounds[index], bounds[index + 1])
    std::span<const float> params, exp_avg, exp_avg_sq;
  };
  std::vector<Piece> pieces = {};
  std::string layout = {};  // shards.json's "layout" (policy/io/sharded_weights.h)
};

// A collective: every learner rank calls it. Learner 0 makes the temporary step directory; each
// rank writes shards/rank_R.safetensors into it (pieced: the files of its pieces, R the piece) and
// fsyncs it; learner 0 runs write_meta (config,
// tokenizer, side files: everything but the weights), and once every rank reported its file's size
// and xxh3 (an all-reduce), writes shards.json and commits the step as save_checkpoint does.
// A rank that fails makes every rank return an error and nothing is committed. Returns the step
// directory (on ranks other than 0: where learner 0 commits it).
Result<std::string> save_sharded_checkpoint(const std::string& checkpoints_dir, const CheckpointData& data,
                                            const ModelDirWriter& write_meta, const RankShard& shard,
                                            Communicator& comm, const CheckpointOptions& options);

// step_dir holds shards.json.
bool is_sharded_checkpoint(const std::string& step_dir);

// The whole trainable buffer of a sharded checkpoint (any rank count) into params; the table must
// be `specs` (an error names the first tensor that differs: a checkpoint of another model).
Status read_sharded_params(const std::string& step_dir, const std::vector<policy::TensorSpec>& specs,
                           std::span<float> params);

}  // namespace troupe::learner
