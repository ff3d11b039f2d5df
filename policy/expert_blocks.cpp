// expert_blocks.h: the whole arena's stretches by expert-parallel block, from the tensor names.
#include "troupe/policy/expert_blocks.h"

#include <algorithm>
#include <map>

namespace troupe::policy {

int routed_expert_of(std::string_view name) {
  static constexpr std::string_view key = ".experts.";
  const size_t at = name.find(key);
  if (at == std::string_view::npos) return -1;
  size_t i = at + key.size();
  int e = 0;
  const size_t first = i;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) e = e * 10 + (name[i] - '0');
  return i > first && i < name.size() && name[i] == '.' ? e : -1;
}

void append_stretch(std::vector<ExpertBlockStretch>& stretches, size_t begin, size_t end, int owner) {
  if (end <= begin) return;
  if (!stretches.empty() && stretches.back().owner == owner && stretches.back().end == begin)
    stretches.back().end = end;
  else
    stretches.push_back({begin, end, owner});
}

std::vector<ExpertBlockStretch> expert_block_stretches(const std::vector<TensorSpec>& table, int blocks) {
  std::vector<TensorSpec> sorted;
  int experts = 0;
  for (const auto& t : table)
    if (!t.quantized) {
      sorted.push_back(t);
      experts = std::max(experts, routed_expert_of(t.name) + 1);
    }
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  const int E = std::max(1, blocks);
  const int per_block = std::max(1, experts / E);
  std::vector<ExpertBlockStretch> out;
  size_t end = 0;
  for (const auto& t : sorted) {
    const size_t b = std::max(t.offset, end), e = t.offset + t.numel();
    if (e <= b) continue;  // (values another tensor covers already: a tied head)
    const int x = routed_expert_of(t.name);
    append_stretch(out, end, b, -1);  // (values of no tensor, if any: every block's)
    append_stretch(out, b, e, x < 0 ? -1 : std::min(x / per_block, E - 1));
    end = e;
  }
  return out;
}

std::vector<ArenaPiece> expert_block_pieces(const std::vector<TensorSpec>& whole_table,
                                            const std::vector<TensorSpec>& block_table, int shard, int shards) {
  std::map<std::string_view, size_t> local;  // a held tensor's offset in the block's arena
  for (const TensorSpec& t : block_table) local.emplace(t.name, t.offset);
  std::map<size_t, std::string_view> starting;  // the whole table's tensor at each offset
  for (const TensorSpec& t : whole_table) starting.emplace(t.offset, t.name);
  std::vector<ArenaPiece> out;
  for (const ExpertBlockStretch& s : expert_block_stretches(whole_table, shards)) {
    ArenaPiece p{s.begin, ArenaPiece::npos, s.end - s.begin, s.owner};
    const auto first = starting.find(s.begin);  // (a held stretch lies in one stretch of the block's arena)
    if ((s.owner < 0 || s.owner == shard) && first != starting.end()) {
      const auto at = local.find(first->second);
      if (at != local.end()) p.local = at->second;
    }
    out.push_back(p);
  }
  return out;
}

}  // namespace troupe::policy
