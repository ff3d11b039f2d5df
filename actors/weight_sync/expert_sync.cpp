// A divided-experts learner's runs of the weight sync (expert_sync.h): one lean encoder per run,
// each reading its stretch of the learner's own arena, their heads joined as one piece of runs.
#include "troupe/actors/expert_sync.h"

#include <string>

namespace troupe::actors {

struct ExpertRunsEncoder::Run {
  LocalRun at;
  std::unique_ptr<WeightEncoder> enc;
  size_t checksums = 0;  // its entries of the cut table
};

ExpertRunsEncoder::~ExpertRunsEncoder() = default;

namespace {
// Where value `whole` of the whole arena lies in the arena of the layout's rank (npos: not held).
size_t local_of(const policy::ExpertShardLayout& layout, size_t whole) {
  for (const policy::ArenaPiece& p : layout.pieces)
    if (whole >= p.whole && whole < p.whole + p.size)
      return p.local == policy::ArenaPiece::npos ? p.local : p.local + (whole - p.whole);
  return policy::ArenaPiece::npos;
}
}  // namespace

Result<std::vector<LocalRun>> local_sync_runs(const policy::ExpertShardLayout& layout, std::vector<SyncRun>& runs) {
  runs = expert_sync_runs(layout.whole_table, layout.shards);
  if (runs.empty() || runs.back().end != layout.whole_size)
    return make_error(ErrorCode::internal, "weight sync from the expert blocks: the runs cover " +
                                               std::to_string(runs.empty() ? 0 : runs.back().end) +
                                               " values of an arena of " + std::to_string(layout.whole_size));
  std::vector<LocalRun> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].sender != layout.shard) continue;
    LocalRun r{i, runs[i].begin, runs[i].end - runs[i].begin, local_of(layout, runs[i].begin)};
    // (a run lies in one stretch of this rank's arena: nothing between its ends is another rank's)
    if (r.local == policy::ArenaPiece::npos || local_of(layout, runs[i].end - 1) != r.local + r.n - 1)
      return make_error(ErrorCode::internal, "weight sync from the expert blocks: values [" + std::to_string(r.begin) +
                                                 ", " + std::to_string(runs[i].end) + ") are not one stretch of rank " +
                                                 std::to_string(layout.shard) + "'s arena");
    out.push_back(r);
  }
  return out;
}

Result<std::unique_ptr<ExpertRunsEncoder>> ExpertRunsEncoder::make(WeightDtype dtype,
                                                                   const policy::ExpertShardLayout& layout) {
  std::unique_ptr<ExpertRunsEncoder> x(new ExpertRunsEncoder);
  std::vector<SyncRun> runs;
  TROUPE_ASSIGN_OR_RETURN(const auto mine, local_sync_runs(layout, runs));
  const auto bounds = sync_run_bounds(runs);
  const auto cut = cut_tensor_table(layout.whole_table, bounds);
  for (const LocalRun& lr : mine) {
    Run r;
    r.at = lr;
    auto table = shard_tensor_table(cut, bounds, lr.index);
    r.checksums = table.size();
    r.enc = std::make_unique<WeightEncoder>(dtype, std::move(table));
    r.enc->set_lean_memory(true);  // a full run is its held copy; a big delta goes in full
    x->runs_.push_back(std::move(r));
  }
  return x;
}

std::int64_t ExpertRunsEncoder::held_version() const { return runs_.empty() ? -1 : runs_[0].enc->held_version(); }

size_t ExpertRunsEncoder::values() const {
  size_t n = 0;
  for (const Run& r : runs_) n += r.at.n;
  return n;
}

Status ExpertRunsEncoder::encode(std::span<const float> local, std::int64_t version, bool delta, Weights& head,
                                 std::vector<runtime::Bytes>& payloads) {
  payloads.clear();  // (the last payloads let go first: they may be views of the held copies)
  head = Weights{};
  head.version = version;
  if (runs_.empty()) return {};
  std::vector<Weights> pieces(runs_.size());
  bool full = false;
  for (size_t i = 0; i < runs_.size(); ++i) {
    runs_[i].enc->encode(local.subspan(runs_[i].at.local, runs_[i].at.n), version, delta, pieces[i]);
    full = full || static_cast<WeightEncoding>(pieces[i].encoding) == WeightEncoding::full;
  }
  if (delta && full) {  // a lean encoder's delta went in full: every run in full (the same version), one encoding
    for (size_t i = 0; i < runs_.size(); ++i) {
      pieces[i] = Weights{};
      runs_[i].enc->encode(local.subspan(runs_[i].at.local, runs_[i].at.n), version, false, pieces[i]);
    }
  }
  TROUPE_ASSIGN_OR_RETURN(head, join_piece_heads(pieces));  // (one after another, as one arena)
  for (size_t i = 0; i < runs_.size(); ++i) {
    head.runs.insert(head.runs.end(), {runs_[i].at.begin, runs_[i].at.n, runs_[i].checksums});
    payloads.push_back(std::move(pieces[i].payload));
  }
  return {};
}

}  // namespace troupe::actors
