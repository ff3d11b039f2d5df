// Weight sync from divided experts (learners_divide_experts, weights_from_shards): a learner of the
// first expert-parallel group encodes the runs of the whole arena it sends (expert_sync_runs: its
// experts and its part of the values every rank holds), read straight from its own arena, and
// answers with one piece of several runs (Weights::runs), which join_piece_heads cuts back into
// runs and joins in arena order. Invariant: the joined message is the one a single WeightEncoder
// over the whole arena and the cut table (sync_tensor_table) sends, so no learner holds the whole
// weights, nor the generators' whole copy of them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/actors/weight_encoder.h"
#include "troupe/actors/weight_shards.h"
#include "troupe/base/result.h"
#include "troupe/policy/model.h"

namespace troupe::actors {

// The runs of expert_sync_runs(layout.whole_table, layout.shards) that expert-parallel rank
// layout.shard sends (and writes in a checkpoint), with where each lies in its arena, in arena order;
// `runs` gets every run (all ranks'). An error when a run is not one stretch of this rank's arena
// (a layout other than the table's).
struct LocalRun {
  size_t index = 0;  // in `runs`
  size_t begin = 0, n = 0, local = 0;  // its first value in the whole arena, its values, where in this rank's
};
Result<std::vector<LocalRun>> local_sync_runs(const policy::ExpertShardLayout& layout, std::vector<SyncRun>& runs);

class ExpertRunsEncoder {
 public:
  // The runs expert-parallel rank layout.shard sends, each with a lean WeightEncoder (weight_shards.h)
  // over its entries of the cut table. An error when a run does not lie in one stretch of this
  // rank's arena (a layout other than the table's).
  static Result<std::unique_ptr<ExpertRunsEncoder>> make(WeightDtype dtype, const policy::ExpertShardLayout& layout);
  ~ExpertRunsEncoder();
  // This rank's runs of `version` from `local` (its model's arena, laid out as the layout), in full
  // or as deltas against what it encoded last (`delta`, when it holds a version; a run whose lean
  // encoder went in full makes every run go in full), joined as one piece: its values, chunks and
  // checksums run after run, Weights::runs naming them. A rank that sends nothing gets elements 0.
  // The head answers the coordinator (no payload); `payloads` gets each run's payload (views of the
  // encoders' buffers, no copy), which the learner sends at the offsets the coordinator names.
  Status encode(std::span<const float> local, std::int64_t version, bool delta, Weights& head,
                std::vector<runtime::Bytes>& payloads);
  std::int64_t held_version() const;
  size_t values() const;  // the values it sends

 private:
  ExpertRunsEncoder() = default;
  struct Run;
  std::vector<Run> runs_;
};

}  // namespace troupe::actors
