// Loading a part of a checkpoint's weights and moments (checkpoint_ranges.h): each range of the
// whole flat buffer is read from the files that hold it, on demand, each file opened once.
#include "troupe/learner/checkpoint_ranges.h"

#include <algorithm>
#include <filesystem>
#include <functional>

#include "troupe/policy/io/safetensors.h"
#include "troupe/policy/io/sharded_weights.h"

namespace troupe::learner {

namespace fs = std::filesystem;

std::vector<HeldRange> held_ranges(const policy::ExpertShardLayout& layout) {
  std::vector<HeldRange> out;
  for (const policy::ArenaPiece& p : layout.pieces)
    if (p.local != policy::ArenaPiece::npos) out.push_back({p.whole, p.local, p.size});
  return out;
}

namespace {

constexpr const char* kBuffers[3] = {policy::io::kShardParams, "exp_avg", "exp_avg_sq"};

// Values [begin, begin + out.size()) of a named flat buffer (params, exp_avg, exp_avg_sq) into out.
using RangeSource = std::function<Status(const std::string& buffer, size_t begin, std::span<float> out)>;

// A whole checkpoint: the weights by the table's names from model.safetensors (or its index), the
// moments as exp_avg.<name> / exp_avg_sq.<name> from optimizer.safetensors; a range is cut at the
// table's tensors, each tensor's overlap read alone.
class WholeSource {
 public:
  // weights false: the moments alone (the weights' files are not opened).
  static Result<WholeSource> open(const std::string& step_dir, const std::vector<policy::TensorSpec>& table,
                                  bool weights) {
    WholeSource s(table);
    if (weights) {
      TROUPE_ASSIGN_OR_RETURN(s.weights_, policy::io::WeightSource::open_dir(step_dir, policy::io::DataLoad::on_demand));
    }
    TROUPE_ASSIGN_OR_RETURN(s.moments_, policy::io::SafetensorsFile::open((fs::path(step_dir) / kOptimizerFile).string(),
                                                                          policy::io::DataLoad::on_demand));
    return s;
  }

  Status read(const std::string& buffer, size_t begin, std::span<float> out) const {
    const size_t end = begin + out.size();
    size_t covered = 0;
    for (const policy::TensorSpec& t : *table_) {
      const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel());
      if (lo >= hi) continue;
      TROUPE_TRY(read_tensor(buffer, t, lo - t.offset, out.subspan(lo - begin, hi - lo)));
      covered += hi - lo;
    }
    if (covered != out.size())
      return invalid_input("checkpoint: values [" + std::to_string(begin) + ", " + std::to_string(end) +
                           ") of the model's buffer are not all in its tensor table");
    return {};
  }

 private:
  explicit WholeSource(const std::vector<policy::TensorSpec>& table) : table_(&table) {}

  Status read_tensor(const std::string& buffer, const policy::TensorSpec& t, size_t first, std::span<float> out) const {
    const bool weights = buffer == policy::io::kShardParams;
    const std::string name = weights ? t.name : buffer + "." + t.name;
    const policy::io::SafetensorsEntry* e = weights ? weights_.find(name) : moments_.find(name);
    const std::string file = weights ? weights_.file_of(name) : moments_.path();
    if (!e) return invalid_input("checkpoint: " + (weights ? weights_.describe() : file) + ": missing tensor '" + name + "'");
    if (e->shape != t.shape)
      return invalid_input("checkpoint: " + file + ": tensor '" + name + "' has shape " +
                           policy::io::shape_string(e->shape) + ", the model's " + policy::io::shape_string(t.shape));
    return weights ? weights_.read_flat(name, first, out) : moments_.read_flat(name, first, out);
  }

  const std::vector<policy::TensorSpec>* table_;
  policy::io::WeightSource weights_;
  policy::io::SafetensorsFile moments_;
};

// A sharded checkpoint (shards.json): its table must be the model's, then every range comes from the
// files that hold it (policy::io::ShardRangeReader).
Result<policy::io::ShardRangeReader> open_shards(const std::string& step_dir,
                                                 const std::vector<policy::TensorSpec>& table) {
  TROUPE_ASSIGN_OR_RETURN(auto m, policy::io::read_shard_manifest(step_dir));
  if (m.kind != "model")
    return invalid_input("checkpoint: " + m.path + " holds " + m.kind + " values, not a whole model's weights");
  TROUPE_TRY(policy::io::check_shard_table(m, table, "the model"));
  return policy::io::ShardRangeReader(step_dir, std::move(m), false);  // (verified before: check_checkpoint_listing)
}

Status read_ranges(const RangeSource& source, std::span<const HeldRange> ranges, std::span<float> params,
                   AdamW& moments) {
  const std::span<float> into[3] = {params, moments.exp_avg(), moments.exp_avg_sq()};
  const bool weights = !params.empty();  // (empty: the moments alone)
  const size_t n = moments.size();
  for (const HeldRange& r : ranges) {
    if (r.local > n || r.size > n - r.local || (weights && params.size() != n))
      return make_error(ErrorCode::internal, "checkpoint: range [" + std::to_string(r.local) + ", " +
                                                 std::to_string(r.local + r.size) + ") of buffers of " +
                                                 std::to_string(params.size()) + " weights and " +
                                                 std::to_string(n) + " moments");
    for (size_t b = weights ? 0 : 1; b < 3; ++b) TROUPE_TRY(source(kBuffers[b], r.whole, into[b].subspan(r.local, r.size)));
  }
  return {};
}

}  // namespace

Result<CheckpointData> load_checkpoint_ranges(const std::string& step_dir,
                                              const std::vector<policy::TensorSpec>& whole_table,
                                              std::span<const HeldRange> ranges, std::span<float> params,
                                              AdamW& moments) {
  TROUPE_ASSIGN_OR_RETURN(auto state, check_checkpoint_listing(step_dir));
  if (state["files"].contains(policy::io::kShardManifestFile)) {
    TROUPE_ASSIGN_OR_RETURN(auto shards, open_shards(step_dir, whole_table));
    TROUPE_TRY(read_ranges([&shards](const std::string& b, size_t at, std::span<float> out) { return shards.read(b, at, out); },
                           ranges, params, moments));
  } else {
    TROUPE_ASSIGN_OR_RETURN(auto whole, WholeSource::open(step_dir, whole_table, !params.empty()));
    TROUPE_TRY(read_ranges([&whole](const std::string& b, size_t at, std::span<float> out) { return whole.read(b, at, out); },
                           ranges, params, moments));
  }
  return checkpoint_data(state, moments);
}

}  // namespace troupe::learner
