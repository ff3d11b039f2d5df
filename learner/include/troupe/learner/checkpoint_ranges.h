// A learner that holds a part of the model's flat buffer (divided experts: its block of experts and
// everything every rank holds, policy::ExpertShardLayout; a sharded learner: its shard of the
// moments, and under ZeRO-3 of the weights) loads that part of a checkpoint alone: the
// weights and both AdamW moments of its ranges, from whichever files hold them, whatever layout wrote
// the checkpoint (whole: model.safetensors + optimizer.safetensors; sharded: shards.json's files, a
// sharded run's learner shards or divided experts' `expert_runs E'` with any E'). Invariant: only the
// ranges' bytes of the weight and moment files are read, each file opened once for the load.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/learner/checkpoint.h"
#include "troupe/learner/optimizer.h"
#include "troupe/policy/model.h"

namespace troupe::learner {

// Values [whole, whole + size) of the checkpoint's flat buffer (the whole model's, in its tensor
// table) go to [local, local + size) of the reader's own buffers.
struct HeldRange {
  size_t whole = 0;
  size_t local = 0;
  size_t size = 0;
};

// What a model holding one block of experts holds: its layout's pieces held by every rank or by its
// block, in arena order.
std::vector<HeldRange> held_ranges(const policy::ExpertShardLayout& layout);

// Reads `ranges` of checkpoint step_dir's weights into `params` and of its moments into `moments`
// (the reader's own buffers; values outside the ranges are left as they are; `params` empty: the
// moments alone, the weights' files not opened: a ZeRO-1/2 learner's share of the moments), checks state.json and
// the sizes of the files it reads (check_checkpoint_listing: not their checksums, which would read
// every byte; `troupe run --resume` runs verify_checkpoint before the learners load) and returns the
// checkpoint's state (checkpoint_data). `whole_table` is the model's whole tensor table: a whole
// checkpoint's tensors are read by its names (their shapes checked), a sharded one's table must equal
// it. Errors name the file (and a shard's rank) and the tensor.
Result<CheckpointData> load_checkpoint_ranges(const std::string& step_dir,
                                              const std::vector<policy::TensorSpec>& whole_table,
                                              std::span<const HeldRange> ranges, std::span<float> params,
                                              AdamW& moments);

}  // namespace troupe::learner
