// Weight sync from sharded learners (learner.shard): each learner rank encodes only its shard of the
// flat arena (a WeightEncoder over its part of the cut table), and the pieces join into one Weights.
// Invariant: when the table tiles the arena, the joined message is bit for bit what one WeightEncoder
// over the whole arena and the cut table sends, so a generator applies and checks it with
// apply_weights and the same cut table (every checksum covers values of one shard).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "troupe/actors/experiment_config.h"
#include "troupe/actors/messages.h"
#include "troupe/base/result.h"
#include "troupe/policy/model.h"

namespace troupe::actors {

// The tensor table cut at the shard bounds (learner::shard_bounds: ranks + 1 offsets from 0 to the
// arena's size), in arena order: a tensor whose values lie in several shards becomes one entry per
// shard, named "NAME[a:b]" (its values a to b) and shaped {b - a}; the others are kept as they are.
// Quantized base tensors (QLoRA: not in the arena) are left out.
std::vector<policy::TensorSpec> cut_tensor_table(const std::vector<policy::TensorSpec>& table,
                                                 std::span<const size_t> bounds);
// The entries of a cut table that lie in shard r = [bounds[r], bounds[r + 1]), their offsets from
// bounds[r] (what rank r's WeightEncoder is made with).
std::vector<policy::TensorSpec> shard_tensor_table(const std::vector<policy::TensorSpec>& cut,
                                                   std::span<const size_t> bounds, size_t r);
// Every shard's Weights (rank order; piece r encoded from shard r's values with shard_tensor_table(r))
// joined into one message of the whole arena: the same version, base, encoding, dtype and chunk size
// on every piece, or an error naming the piece and the field. The probe comes from piece 0.
Result<Weights> join_weight_shards(std::span<const Weights> pieces, std::span<const size_t> bounds);
// The same, the bounds read from the pieces' value counts (piece r holds bounds[r + 1] - bounds[r]).
Result<Weights> join_weight_pieces(std::span<const Weights> pieces);
// join_weight_shards without the payloads: the joined message's every other field, from the pieces'
// heads (their payloads may be empty; the joined payload is theirs in rank order, payload_bytes of
// each). What the coordinator sends the generators while the learners send the payloads
// (weight_pieces.h).
Result<Weights> join_weight_heads(std::span<const Weights> pieces, std::span<const size_t> bounds);
// The bounds from the value counts. Heads of several runs (Weights::runs, divided experts) are cut
// into their runs, which are joined in whole-arena order (they must tile it; a head with no values
// and no runs adds nothing, and the probe is heads[0]'s). `spans`, when given, gets per head the
// joined payload's bytes its piece fills, in the piece's order: (first byte, bytes) pairs, one pair
// per run (one for a head of one run, the heads' payloads then following in rank order; none for
// a head with no values).
Result<Weights> join_piece_heads(std::span<const Weights> heads,
                                 std::vector<std::vector<std::uint64_t>>* spans = nullptr);
// A message's payload bytes as its chunk table says (the sum of chunk_bytes), payload or not.
std::uint64_t payload_bytes(const Weights& w);

// Divided experts (learners_divide_experts): which learner of the first expert-parallel group sends
// which values of the whole arena. Each routed-expert block goes with the rank that holds it
// (policy::expert_block_stretches, the one source of the expert ranges: expert e of a layer is rank
// e / (num_experts / E)'s); everything else (held by every rank: embeddings, attention, routers,
// norms, shared experts) is cut in E contiguous parts of as many values as shard_bounds gives, part q
// sent by rank q, so every rank sends as many values as it can (its own experts and 1/E of the rest).
// Runs in arena order, tiling it, adjacent runs of one sender merged. `whole_table` is the whole
// model's tensor table.
struct SyncRun {
  size_t begin = 0, end = 0;  // [begin, end) of the whole arena
  int sender = 0;             // its expert-parallel rank (= learner rank in the first group)
};
std::vector<SyncRun> expert_sync_runs(const std::vector<policy::TensorSpec>& whole_table, int expert_parallel);
// The runs' bounds: runs.size() + 1 offsets, from 0 to the arena's end (cut_tensor_table's `bounds`).
std::vector<size_t> sync_run_bounds(std::span<const SyncRun> runs);

// Whether `troupe run` syncs the weights from the shards: learner.shard other than none on more than
// one learner, or the experts divided (learners_divide_experts) over more than one learner, with
// weight_sync.transport zmq (a broadcast over the weight group sends learner 0's whole values).
// Then every learner encodes its own shard (divided experts: the first group's learners their
// expert_sync_runs) and sends it to the generators (weight_pieces.h), which put the message
// together and apply it with sync_tensor_table's cut table.
bool weights_from_shards(const ExperimentConfig& cfg);
// The table the generators' Weights checksums follow: the model's table cut at the learners' shard
// bounds (divided experts: at the bounds of expert_sync_runs) when weights_from_shards(cfg), else
// the model's own (`params` values in the arena).
std::vector<policy::TensorSpec> sync_tensor_table(const ExperimentConfig& cfg,
                                                  const std::vector<policy::TensorSpec>& table, size_t params);

}  // namespace troupe::actors
