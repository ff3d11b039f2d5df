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
Result<Weights> join_piece_heads(std::span<const Weights> heads);  // the bounds from the value counts
// A message's payload bytes as its chunk table says (the sum of chunk_bytes), payload or not.
std::uint64_t payload_bytes(const Weights& w);

// Whether `troupe run` syncs the weights from the shards: learner.shard other than none on more than
// one learner, with weight_sync.transport zmq (a broadcast over the weight group sends learner 0's
// whole values). Then every learner encodes its own shard and sends it to the generators
// (weight_pieces.h), which put the message together and apply it with sync_tensor_table's cut table.
bool weights_from_shards(const ExperimentConfig& cfg);
// The table the generators' Weights checksums follow: the model's table cut at the learners' shard
// bounds when weights_from_shards(cfg), else the model's own (`params` values in the arena).
std::vector<policy::TensorSpec> sync_tensor_table(const ExperimentConfig& cfg,
                                                  const std::vector<policy::TensorSpec>& table, size_t params);

}  // namespace troupe::actors
