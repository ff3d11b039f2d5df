// A sharded learner's checkpoint, written by every rank in parallel (sharded_checkpoint.h) and read
// back at any rank count. Invariant: the step is committed (renamed into place by learner 0) only
// after an all-reduce in which every rank reported its shard file written and fsynced.
#include "troupe/learner/sharded_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "troupe/policy/io/sharded_weights.h"

namespace troupe::learner {

namespace fs = std::filesystem;
namespace io = policy::io;

namespace {

// Per rank in the all-reduce of the written files: ok, bytes, the xxh3's two halves.
constexpr size_t kReport = 4;

// The pieces this rank writes: its own shard, or RankShard::pieces.
std::vector<RankShard::Piece> pieces_of(const RankShard& s, int rank) {
  if (s.pieced) return s.pieces;
  return {{static_cast<size_t>(rank), s.params, s.exp_avg, s.exp_avg_sq}};
}

Result<io::ShardFile> write_piece_file(const std::string& tmp, const RankShard& s, const RankShard::Piece& p,
                                       int world) {
  const size_t lo = s.bounds[p.index], hi = s.bounds[p.index + 1];
  TROUPE_ASSIGN_OR_RETURN(auto f, io::write_shard_file(tmp, static_cast<int>(p.index), world, lo, hi,
                                                       {{io::kShardParams, p.params},
                                                        {"exp_avg", p.exp_avg},
                                                        {"exp_avg_sq", p.exp_avg_sq}}));
  TROUPE_TRY(fsync_file((fs::path(tmp) / f.path).string()));
  return f;
}

// Every piece of this rank written, its report (ok, bytes, xxh3) in `reports`; the first error.
Status write_rank_files(const std::string& tmp, const RankShard& s, int rank, int world, std::vector<double>& reports) {
  for (const RankShard::Piece& p : pieces_of(s, rank)) {
    TROUPE_ASSIGN_OR_RETURN(auto f, write_piece_file(tmp, s, p, world));
    double* rep = reports.data() + kReport * p.index;
    rep[0] = 1.0;
    rep[1] = static_cast<double>(f.bytes);
    rep[2] = static_cast<double>(f.xxh3 >> 32);
    rep[3] = static_cast<double>(f.xxh3 & 0xffffffffu);
  }
  return {};
}

io::ShardManifest manifest_of(const RankShard& s, int world, const std::vector<double>& reports) {
  io::ShardManifest m;
  m.kind = s.kind;
  m.stage = s.stage;
  m.layout = s.layout;
  m.world_size = world;
  m.bounds.assign(s.bounds.begin(), s.bounds.end());
  m.tensors = *s.specs;
  m.buffers = {io::kShardParams, "exp_avg", "exp_avg_sq"};
  for (int r = 0; r < world; ++r) {
    const double* rep = reports.data() + kReport * static_cast<size_t>(r);
    io::ShardFile f;
    f.rank = r;
    f.path = "shards/rank_" + std::to_string(r) + ".safetensors";
    f.begin = m.bounds[static_cast<size_t>(r)];
    f.end = m.bounds[static_cast<size_t>(r) + 1];
    f.bytes = static_cast<uint64_t>(rep[1]);
    f.xxh3 = (static_cast<uint64_t>(rep[2]) << 32) | static_cast<uint64_t>(rep[3]);
    m.files.push_back(std::move(f));
  }
  return m;
}

}  // namespace

Result<std::string> save_sharded_checkpoint(const std::string& checkpoints_dir, const CheckpointData& data,
                                            const ModelDirWriter& write_meta, const RankShard& shard,
                                            Communicator& comm, const CheckpointOptions& options) {
  const int rank = comm.rank();
  const int world = shard.pieced ? static_cast<int>(shard.bounds.size()) - 1 : comm.size();  // (files)
  const std::string where = "checkpoint of step " + std::to_string(data.step);
  if (shard.bounds.size() != static_cast<size_t>(world) + 1 || world < 1 || !shard.specs)
    return make_error(ErrorCode::internal, where + ": shard bounds for another rank count");
  for (const RankShard::Piece& p : shard.pieces)
    if (p.index >= static_cast<size_t>(world))
      return make_error(ErrorCode::internal, where + ": piece " + std::to_string(p.index) + " of " + std::to_string(world));
  // 1. learner 0 makes the temporary directory and tells the others its name (its pid)
  std::vector<double> head(2, 0.0);
  Result<std::string> begun = std::string();
  if (rank == 0) {
    begun = begin_checkpoint_dir(checkpoints_dir, data.step, std::to_string(::getpid()));
    if (begun.ok()) head = {1.0, static_cast<double>(::getpid())};
  }
  TROUPE_TRY(comm.allreduce_sum(std::span<double>(head)));
  if (head[0] != 1.0)
    return rank == 0 ? Error(begun.error())
                     : invalid_input(where + ": learner 0 could not make its directory (learner 0 reports why)");
  const std::string tmp = (fs::path(checkpoints_dir) /
                           (".tmp_step_" + std::to_string(data.step) + "." + std::to_string(static_cast<long long>(head[1]))))
                              .string();
  // 2. every rank its files, learner 0 the rest of the directory
  std::vector<double> reports(kReport * static_cast<size_t>(world), 0.0);
  Status file = write_rank_files(tmp, shard, rank, world, reports);
  Status meta = rank == 0 && file.ok() ? write_meta(tmp) : Status{};
  if (!file.ok() || !meta.ok()) std::fill(reports.begin(), reports.end(), 0.0);
  TROUPE_TRY(comm.allreduce_sum(std::span<double>(reports)));
  if (!file.ok()) return make_error(file.error().code, where + ": learner rank " + std::to_string(rank) + ": " + file.error().message);
  if (!meta.ok()) return meta.error();
  std::string failed;
  for (int r = 0; r < world; ++r)
    if (reports[kReport * static_cast<size_t>(r)] != 1.0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!failed.empty())
    return make_error(ErrorCode::io, where + (shard.pieced ? ": the files of piece(s) " + failed + " could not be written"
                                                           : ": learner rank(s) " + failed + " could not write their shard") +
                                         " (their logs say why); nothing was committed");
  const std::string final_dir = (fs::path(checkpoints_dir) / ("step_" + std::to_string(data.step))).string();
  if (rank != 0) return final_dir;
  // 3. learner 0: the layout, then state.json and the rename
  TROUPE_TRY(io::write_shard_manifest(tmp, manifest_of(shard, world, reports)));
  return commit_checkpoint_dir(checkpoints_dir, tmp, data, shard.optimizer_steps, options);
}

bool is_sharded_checkpoint(const std::string& step_dir) { return io::has_shard_manifest(step_dir); }

Status read_sharded_params(const std::string& step_dir, const std::vector<policy::TensorSpec>& specs,
                           std::span<float> params) {
  TROUPE_ASSIGN_OR_RETURN(auto m, io::read_shard_manifest(step_dir));
  TROUPE_TRY(io::check_shard_table(m, specs, "the model"));
  if (m.numel() != params.size())
    return invalid_input(m.path + ": holds " + std::to_string(m.numel()) + " values, the model " + std::to_string(params.size()));
  TROUPE_ASSIGN_OR_RETURN(auto flat, io::read_shard_buffer(step_dir, m, io::kShardParams, 0, params.size()));
  std::copy(flat.begin(), flat.end(), params.begin());
  return {};
}

}  // namespace troupe::learner
