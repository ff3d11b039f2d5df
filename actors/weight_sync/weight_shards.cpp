// Weight sync from sharded learners (weight_shards.h): the cut tensor table and the join of the
// shards' messages. Invariant: the joined chunks, payload and checksums are the pieces' in rank
// order, each chunk moved by its shard's first value, so nothing is re-encoded or re-hashed.
#include "troupe/actors/weight_shards.h"

#include <algorithm>
#include <string>

#include "troupe/learner/communicator.h"
#include "wire_format.h"

namespace troupe::actors {

std::vector<policy::TensorSpec> cut_tensor_table(const std::vector<policy::TensorSpec>& table,
                                                 std::span<const size_t> bounds) {
  std::vector<policy::TensorSpec> sorted;
  for (const auto& t : table)
    if (!t.quantized) sorted.push_back(t);
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::vector<policy::TensorSpec> out;
  for (const auto& t : sorted) {
    const size_t b = t.offset, e = t.offset + t.numel();
    std::vector<size_t> cuts{b};
    for (size_t r = 1; r + 1 < bounds.size(); ++r)
      if (bounds[r] > b && bounds[r] < e) cuts.push_back(bounds[r]);
    cuts.push_back(e);
    if (cuts.size() == 2) {
      out.push_back(t);
      continue;
    }
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      policy::TensorSpec piece;
      piece.name = t.name + "[" + std::to_string(cuts[i] - b) + ":" + std::to_string(cuts[i + 1] - b) + "]";
      piece.shape = {static_cast<int64_t>(cuts[i + 1] - cuts[i])};
      piece.offset = cuts[i];
      out.push_back(std::move(piece));
    }
  }
  return out;
}

std::vector<policy::TensorSpec> shard_tensor_table(const std::vector<policy::TensorSpec>& cut,
                                                   std::span<const size_t> bounds, size_t r) {
  const size_t lo = bounds[r], hi = bounds[r + 1], last = bounds.size() - 2;
  std::vector<policy::TensorSpec> out;
  for (const auto& t : cut) {
    // An empty tensor at a bound belongs to the shard it starts (the last shard: the arena's end).
    const bool inside = t.numel() > 0 ? t.offset >= lo && t.offset + t.numel() <= hi
                                      : t.offset >= lo && (t.offset < hi || (r == last && t.offset == hi));
    if (!inside) continue;
    out.push_back(t);
    out.back().offset -= lo;
  }
  return out;
}

namespace {

Status check_piece(const Weights& p, const Weights& first, size_t r, size_t elements) {
  auto bad = [&](const std::string& what) {
    return invalid_input("weight sync from shards: piece " + std::to_string(r) + " " + what);
  };
  const auto enc = static_cast<WeightEncoding>(p.encoding);
  if (enc != WeightEncoding::full && enc != WeightEncoding::delta)
    return bad("has encoding " + std::to_string(p.encoding) + ", neither full (1) nor delta (2)");
  if (p.version != first.version || p.base_version != first.base_version)
    return bad("is version " + std::to_string(p.version) + " against base " + std::to_string(p.base_version) +
               ", piece 0 version " + std::to_string(first.version) + " against base " +
               std::to_string(first.base_version));
  if (p.encoding != first.encoding || p.dtype != first.dtype || p.chunk_elements != first.chunk_elements)
    return bad("differs from piece 0 in its encoding, dtype or chunk_elements");
  if (p.elements != elements)
    return bad("has " + std::to_string(p.elements) + " values for a shard of " + std::to_string(elements));
  if (p.chunk_bytes.size() != p.chunk_format.size())
    return bad("has " + std::to_string(p.chunk_bytes.size()) + " chunk sizes and " +
               std::to_string(p.chunk_format.size()) + " chunk formats");
  return {};
}

// A full payload as it is (no chunk starts, every chunk stored): the joined one is the arena's wire
// bits in chunks of chunk_elements from its start, as one encoder writes it.
bool raw_full(std::span<const Weights> pieces) {
  for (const auto& p : pieces) {
    if (static_cast<WeightEncoding>(p.encoding) != WeightEncoding::full || !p.chunk_starts.empty()) return false;
    for (auto f : p.chunk_format)
      if (f != 0) return false;
  }
  return true;
}

}  // namespace

Result<Weights> join_weight_heads(std::span<const Weights> pieces, std::span<const size_t> bounds) {
  if (pieces.empty() || pieces.size() + 1 != bounds.size())
    return invalid_input("weight sync from shards: " + std::to_string(pieces.size()) + " pieces for " +
                         std::to_string(bounds.size() > 0 ? bounds.size() - 1 : 0) + " shards");
  for (size_t r = 0; r < pieces.size(); ++r)
    TROUPE_TRY(check_piece(pieces[r], pieces[0], r, bounds[r + 1] - bounds[r]));
  const Weights& first = pieces[0];
  Weights out;
  out.version = first.version;
  out.base_version = first.base_version;
  out.encoding = first.encoding;
  out.dtype = first.dtype;
  out.elements = bounds.back();
  out.chunk_elements = first.chunk_elements;
  out.probe_tokens = first.probe_tokens;
  out.probe_logprobs = first.probe_logprobs;
  const bool raw = raw_full(pieces);
  const size_t C = first.chunk_elements, W = codec::width_of(static_cast<WeightDtype>(first.dtype));
  for (size_t r = 0; r < pieces.size(); ++r) {
    const Weights& p = pieces[r];
    out.checksums.insert(out.checksums.end(), p.checksums.begin(), p.checksums.end());
    out.changed += p.changed;
    if (raw) continue;
    const size_t lo = bounds[r];
    if (p.chunk_starts.empty()) {  // chunks of C from the shard's start
      for (size_t a = 0; a < p.elements; a += C) out.chunk_starts.push_back(lo + a);
    } else {
      for (auto s : p.chunk_starts) out.chunk_starts.push_back(lo + s);
    }
    out.chunk_bytes.insert(out.chunk_bytes.end(), p.chunk_bytes.begin(), p.chunk_bytes.end());
    out.chunk_format.insert(out.chunk_format.end(), p.chunk_format.begin(), p.chunk_format.end());
  }
  if (raw && C > 0)
    for (size_t a = 0; a < out.elements; a += C) {
      out.chunk_bytes.push_back(std::min(C, out.elements - a) * W);
      out.chunk_format.push_back(0);
    }
  return out;
}

Result<Weights> join_weight_shards(std::span<const Weights> pieces, std::span<const size_t> bounds) {
  TROUPE_ASSIGN_OR_RETURN(Weights out, join_weight_heads(pieces, bounds));
  std::string payload;
  size_t bytes = 0;
  for (const auto& p : pieces) bytes += p.payload.size();
  payload.reserve(bytes);
  for (const auto& p : pieces) payload.append(p.payload.data(), p.payload.size());
  out.payload = runtime::Bytes(std::move(payload));
  return out;
}

std::uint64_t payload_bytes(const Weights& w) {
  std::uint64_t n = 0;
  for (auto b : w.chunk_bytes) n += b;
  return n;
}

namespace {
std::vector<size_t> bounds_of(std::span<const Weights> pieces) {
  std::vector<size_t> bounds{0};
  for (const auto& p : pieces) bounds.push_back(bounds.back() + p.elements);
  return bounds;
}
}  // namespace

Result<Weights> join_weight_pieces(std::span<const Weights> pieces) {
  return join_weight_shards(pieces, bounds_of(pieces));
}

Result<Weights> join_piece_heads(std::span<const Weights> heads) { return join_weight_heads(heads, bounds_of(heads)); }

bool weights_from_shards(const ExperimentConfig& cfg) {
  return cfg.learner.shard != learner::ShardStage::none && cfg.cluster.learners > 1 &&
         cfg.weight_sync.transport == WeightTransport::zmq;
}

std::vector<policy::TensorSpec> sync_tensor_table(const ExperimentConfig& cfg,
                                                  const std::vector<policy::TensorSpec>& table, size_t params) {
  if (!weights_from_shards(cfg)) return table;
  return cut_tensor_table(table, learner::shard_bounds(params, cfg.cluster.learners));
}

}  // namespace troupe::actors
