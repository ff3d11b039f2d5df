// Which values of a whole MoE model's flat arena each expert-parallel block holds (policy.moe.
// expert_parallel E, the learners' memory divided): a routed expert e of a layer, whose tensors are
// named ...experts.<e>.<kind>, is block e / (num_experts / E)'s alone; every other value (embeddings,
// attention, routers, norms, shared experts) every block holds. The one source of these ranges: the
// layout of a block (Model::slice_experts, create_expert_block: ExpertShardLayout::pieces), the weight
// sync's runs (actors::expert_sync_runs), the divided checkpoints' files (written from those runs) and
// their readers (learner::held_ranges, from the pieces).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "troupe/policy/model.h"

namespace troupe::policy {

// A stretch [begin, end) of the whole arena and who holds it: every block (owner -1) or block `owner`.
struct ExpertBlockStretch {
  size_t begin = 0, end = 0;
  int owner = -1;
};

// Appends [begin, end) of `owner` to stretches in arena order (nothing when empty), merged into the
// last one when that is the same owner's and ends at `begin`.
void append_stretch(std::vector<ExpertBlockStretch>& stretches, size_t begin, size_t end, int owner);

// A routed expert's index from its tensor's name (...experts.<e>.<kind>), else -1.
int routed_expert_of(std::string_view name);

// The arena of `table` (a whole model's tensor table, quantized entries left out) as stretches in
// arena order, tiling [0, its last value), adjacent stretches of one owner merged; values no tensor
// covers are every block's, values two tensors cover (a tied head) counted once. With `blocks` E the
// experts of a layer go in E contiguous blocks of num_experts / E (num_experts: the most expert
// indices the table names).
std::vector<ExpertBlockStretch> expert_block_stretches(const std::vector<TensorSpec>& table, int blocks);

// The layout of block `shard` of `shards` (ExpertShardLayout::pieces): the stretches of
// `whole_table`, each held one (owner -1 or `shard`) with where it starts in the block's own arena,
// whose table `block_table` is (the whole one's entries without the other blocks' experts).
std::vector<ArenaPiece> expert_block_pieces(const std::vector<TensorSpec>& whole_table,
                                            const std::vector<TensorSpec>& block_table, int shard, int shards);

}  // namespace troupe::policy
