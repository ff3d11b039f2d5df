// Weight sync from sharded learners (weight_shards.h): the cut tensor table and the join of the
// shards' messages. Invariant: the joined chunks, payload and checksums are the pieces' in rank
// order, each chunk moved by its shard's first value, so nothing is re-encoded or re-hashed.
#include "troupe/actors/weight_shards.h"

#include <algorithm>
#include <string>

#include "troupe/learner/communicator.h"
#include "troupe/policy/expert_blocks.h"
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

namespace {

// A head of several runs (Weights::runs) cut into one head per run (no payload), each with its first
// value in the whole arena. `changed` goes with the first run (only the sum counts).
Result<std::vector<std::pair<size_t, Weights>>> split_runs(const Weights& h, size_t r) {
  auto bad = [&](const std::string& what) {
    return invalid_input("weight sync from the expert blocks: learner " + std::to_string(r) + "'s piece " + what);
  };
  if (h.runs.size() % 3 != 0) return bad("lists " + std::to_string(h.runs.size()) + " run numbers, not 3 per run");
  const bool raw = raw_full(std::span<const Weights>(&h, 1));
  if (!raw && h.chunk_starts.size() != h.chunk_bytes.size())
    return bad("has " + std::to_string(h.chunk_bytes.size()) + " chunks and " + std::to_string(h.chunk_starts.size()) +
               " chunk starts (a piece of several runs names each chunk's start)");
  const size_t C = h.chunk_elements, W = codec::width_of(static_cast<WeightDtype>(h.dtype));
  std::vector<std::pair<size_t, Weights>> out;
  size_t v = 0, c = 0, k = 0;  // the run's first value, chunk and checksum in the piece
  for (size_t i = 0; i < h.runs.size(); i += 3) {
    const size_t begin = h.runs[i], n = h.runs[i + 1], sums = h.runs[i + 2];
    if (k + sums > h.checksums.size()) return bad("lists more checksums in its runs than it carries");
    Weights p;
    p.version = h.version;
    p.base_version = h.base_version;
    p.encoding = h.encoding;
    p.dtype = h.dtype;
    p.elements = n;
    p.chunk_elements = h.chunk_elements;
    p.changed = i == 0 ? h.changed : 0;
    p.checksums.assign(h.checksums.begin() + static_cast<std::ptrdiff_t>(k),
                       h.checksums.begin() + static_cast<std::ptrdiff_t>(k + sums));
    k += sums;
    if (raw) {
      for (size_t a = 0; C > 0 && a < n; a += C) {
        p.chunk_bytes.push_back(std::min(C, n - a) * W);
        p.chunk_format.push_back(0);
      }
    } else {
      for (; c < h.chunk_starts.size() && h.chunk_starts[c] < v + n; ++c) {
        if (h.chunk_starts[c] < v) return bad("has its chunks out of order");
        p.chunk_starts.push_back(h.chunk_starts[c] - v);
        p.chunk_bytes.push_back(h.chunk_bytes[c]);
        p.chunk_format.push_back(h.chunk_format[c]);
      }
    }
    v += n;
    out.emplace_back(begin, std::move(p));
  }
  if (v != h.elements || k != h.checksums.size() || (!raw && c != h.chunk_starts.size()))
    return bad("has runs of " + std::to_string(v) + " values and " + std::to_string(k) + " checksums, but carries " +
               std::to_string(h.elements) + " values and " + std::to_string(h.checksums.size()) + " checksums");
  return out;
}

// join_piece_heads of heads of several runs: every run in whole-arena order.
Result<Weights> join_run_heads(std::span<const Weights> heads, std::vector<std::vector<std::uint64_t>>* spans) {
  struct Run {
    size_t begin = 0, head = 0;
    Weights w;
  };
  std::vector<Run> runs;
  for (size_t r = 0; r < heads.size(); ++r) {
    if (heads[r].runs.empty()) {
      if (heads[r].elements != 0)
        return invalid_input("weight sync from the expert blocks: learner " + std::to_string(r) + "'s piece of " +
                             std::to_string(heads[r].elements) + " values names no runs");
      continue;
    }
    TROUPE_ASSIGN_OR_RETURN(auto split, split_runs(heads[r], r));
    for (auto& [begin, w] : split) runs.push_back({begin, r, std::move(w)});
  }
  // (stable: a head's runs keep their order among equal starts, which only empty runs share)
  std::stable_sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.begin < b.begin; });
  std::vector<Weights> pieces;
  std::vector<size_t> bounds{0};
  for (Run& x : runs) {
    if (x.begin != bounds.back())
      return invalid_input("weight sync from the expert blocks: learner " + std::to_string(x.head) +
                           " sends a run from value " + std::to_string(x.begin) + ", but the runs before end at " +
                           std::to_string(bounds.back()));
    bounds.push_back(x.begin + x.w.elements);
    pieces.push_back(std::move(x.w));
  }
  TROUPE_ASSIGN_OR_RETURN(Weights out, join_weight_heads(pieces, bounds));
  out.probe_tokens = heads[0].probe_tokens;
  out.probe_logprobs = heads[0].probe_logprobs;
  if (spans) {
    spans->assign(heads.size(), {});
    std::uint64_t at = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::uint64_t n = payload_bytes(pieces[i]);
      (*spans)[runs[i].head].push_back(at);
      (*spans)[runs[i].head].push_back(n);
      at += n;
    }
  }
  return out;
}

}  // namespace

Result<Weights> join_piece_heads(std::span<const Weights> heads, std::vector<std::vector<std::uint64_t>>* spans) {
  for (const Weights& h : heads)
    if (!h.runs.empty()) return join_run_heads(heads, spans);
  TROUPE_ASSIGN_OR_RETURN(Weights out, join_weight_heads(heads, bounds_of(heads)));
  if (spans) {
    spans->clear();
    std::uint64_t at = 0;
    for (const Weights& h : heads) {
      const std::uint64_t n = payload_bytes(h);
      spans->push_back({at, n});
      at += n;
    }
  }
  return out;
}

std::vector<SyncRun> expert_sync_runs(const std::vector<policy::TensorSpec>& whole_table, int expert_parallel) {
  const int E = std::max(1, expert_parallel);
  // The arena's stretches: owner -1 (every rank holds them) or the expert-parallel rank of a block.
  const auto held = policy::expert_block_stretches(whole_table, E);
  size_t shared = 0;
  for (const auto& h : held)
    if (h.owner < 0) shared += h.end - h.begin;
  const auto parts = learner::shard_bounds(shared, E);
  std::vector<policy::ExpertBlockStretch> cut;  // (owner: the sending rank)
  size_t seen = 0;  // shared values before this stretch
  for (const auto& h : held) {
    if (h.owner >= 0) {
      policy::append_stretch(cut, h.begin, h.end, h.owner);
      continue;
    }
    for (int q = 0; q < E; ++q) {  // the stretch's values in shared part q
      const size_t lo = std::max(parts[static_cast<size_t>(q)], seen);
      const size_t hi = std::min(parts[static_cast<size_t>(q) + 1], seen + (h.end - h.begin));
      if (hi > lo) policy::append_stretch(cut, h.begin + (lo - seen), h.begin + (hi - seen), q);
    }
    seen += h.end - h.begin;
  }
  std::vector<SyncRun> runs;
  for (const auto& c : cut) runs.push_back({c.begin, c.end, c.owner});
  return runs;
}

std::vector<size_t> sync_run_bounds(std::span<const SyncRun> runs) {
  std::vector<size_t> bounds{0};
  for (const SyncRun& r : runs) bounds.push_back(r.end);
  return bounds;
}

bool weights_from_shards(const ExperimentConfig& cfg) {
  return (cfg.learner.shard != learner::ShardStage::none || learners_divide_experts(cfg)) && cfg.cluster.learners > 1 &&
         cfg.weight_sync.transport == WeightTransport::zmq;
}

std::vector<policy::TensorSpec> sync_tensor_table(const ExperimentConfig& cfg,
                                                  const std::vector<policy::TensorSpec>& table, size_t params) {
  if (!weights_from_shards(cfg)) return table;
  if (learners_divide_experts(cfg)) {
    const auto runs = expert_sync_runs(table, cfg.policy.expert_parallel);
    return cut_tensor_table(table, sync_run_bounds(runs));
  }
  return cut_tensor_table(table, learner::shard_bounds(params, cfg.cluster.learners));
}

}  // namespace troupe::actors
