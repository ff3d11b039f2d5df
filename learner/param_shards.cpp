// learner.shard parameters (ZeRO-3): the schedule, and its host memory and collectives (a device's:
// device_shards.cpp). The groups of a rank's weights, gathered per layer from the
// ranks that own them and dropped after use (the next group's gather started while this one computes);
// the gradients reduce-scattered per layer; the pages a gathered group and a gradient being summed
// occupy come from pools that are reused (page_pool.h). Invariant: every gather and reduce-scatter is the sharded
// step's (rank-ordered sums), so the update equals the unsharded one bit for bit; a dropped page is
// never read before it is gathered again, and a buffer in flight is never read, written or dropped.
#include "troupe/learner/param_shards.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "troupe/base/blocking_call.h"

namespace troupe::learner {

namespace {

// Group of a Hugging Face tensor name: -1 the embedding, N for model.layers.N., -2 the rest (head).
int group_of(const std::string& name) {
  if (name.find("embed_tokens") != std::string::npos) return policy::ParamHook::kEmbedGroup;
  const auto at = name.find("layers.");
  if (at == std::string::npos) return -2;
  size_t i = at + 7;
  int n = 0;
  bool digit = false;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i, digit = true) n = n * 10 + (name[i] - '0');
  return digit && i < name.size() && name[i] == '.' ? n : -2;
}

// Gives the whole pages inside [p, p + n) back to the OS: they read as zero when next touched.
// Returns the pages' first and last float (the edges outside them are not touched).
std::pair<float*, float*> drop_pages(float* p, size_t n) {
  const auto [s, e] = whole_pages(p, n);
  if (s < e) madvise(s, static_cast<size_t>(e - s) * sizeof(float), MADV_DONTNEED);
  return {s, e};
}

// The bounds of `bounds`' shards inside [begin, end), from 0.
std::vector<size_t> clamp_bounds(const std::vector<size_t>& bounds, size_t begin, size_t end) {
  std::vector<size_t> out(bounds.size());
  for (size_t j = 0; j < bounds.size(); ++j) out[j] = std::clamp(bounds[j], begin, end) - begin;
  return out;
}

// The whole pages go back to the OS; the values at the edges (pages shared with a neighbour) become
// NaN, so that a read before the next gather would show in every result rather than pass unseen.
void drop_span(float* p, size_t n) {
  const auto [s, e] = drop_pages(p, n);
  std::fill(p, s, std::numeric_limits<float>::quiet_NaN());
  std::fill(e, p + n, std::numeric_limits<float>::quiet_NaN());
}

// The watchdog's name for the gather of group g (a peer dying mid-collective leaves this rank in it).
BlockingCall gather_label(int g, int layers) {
  if (g == policy::ParamHook::kEmbedGroup) return BlockingCall("learner.shard parameters: the all-gather of the embedding");
  if (g >= layers) return BlockingCall("learner.shard parameters: the all-gather of the head (final norm, lm_head)");
  return BlockingCall("learner.shard parameters: the all-gather of decoder layer", g);
}

// The watchdog's name for the gradient reduce-scatter of group g (a decoder layer, or the head).
BlockingCall scatter_label(int g, int layers) {
  if (g >= layers) return BlockingCall("learner.shard parameters: the gradient reduce-scatter of the head (final norm, lm_head)");
  return BlockingCall("learner.shard parameters: the gradient reduce-scatter of decoder layer", g);
}

}  // namespace

ParamShards::ParamShards(std::span<float> params, std::span<float> grads, const std::vector<policy::TensorSpec>& table,
                         std::vector<size_t> bounds, Communicator& comm, bool layered, bool pools)
    : params_(params), grads_(grads), bounds_(std::move(bounds)), comm_(comm), layered_(layered) {
  lo_ = bounds_[static_cast<size_t>(comm_.rank())];
  hi_ = bounds_[static_cast<size_t>(comm_.rank()) + 1];
  // Every tensor's interval with its group; the gaps between them go to the head.
  struct Piece {
    size_t begin, end;
    int group;
  };
  std::vector<Piece> pieces;
  bool lm_head = false;
  for (const auto& t : table) {
    const int g = layered ? group_of(t.name) : -2;
    if (g >= 0) layers_ = std::max(layers_, g + 1);
    lm_head = lm_head || t.name.find("lm_head") != std::string::npos;
    pieces.push_back({t.offset, t.offset + t.numel(), g});
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  std::vector<Piece> merged;
  size_t at = 0;
  auto add = [&](size_t b, size_t e, int g) {
    if (e <= b) return;
    if (!merged.empty() && merged.back().group == g && merged.back().end == b)
      merged.back().end = e;
    else
      merged.push_back({b, e, g});
  };
  for (const auto& p : pieces) {
    const size_t b = std::max(p.begin, at);
    if (b > at) add(at, b, -2);
    add(b, std::max(b, p.end), p.group);
    at = std::max(at, p.end);
  }
  add(at, bounds_.back(), -2);
  groups_.assign(static_cast<size_t>(layers_) + 2, {});  // [0] embedding, [1..L] layers, [L+1] head
  for (const auto& p : merged) {
    ranges_.push_back({p.begin, p.end});
    const int r = static_cast<int>(ranges_.size()) - 1;
    group(p.group == -2 ? layers_ : p.group).push_back(r);
    // Tied embeddings (no lm_head.weight): the head's GEMM reads the embedding.
    if (p.group == kEmbedGroup && !lm_head) group(layers_).push_back(r);
  }
  gathering_.resize(ranges_.size());
  scattering_.resize(ranges_.size());
  if (!layered_ || !pools) return;
  params_pool_ = PooledRanges::create(params_, lo_, hi_, ranges_.size(), pool_bytes(false));
  grads_pool_ = PooledRanges::create(grads_, lo_, hi_, ranges_.size(), pool_bytes(true));
}

ParamShards::~ParamShards() = default;

size_t ParamShards::pool_bytes(bool grads) const {
  auto pages = [&](const std::vector<int>& live) {
    size_t bytes = 0;
    for (int r : live)
      bytes += outer_bytes(grads ? grads_ : params_, ranges_[static_cast<size_t>(r)].begin,
                           ranges_[static_cast<size_t>(r)].end);
    return bytes;
  };
  if (grads) {
    // A tied head's embedding part until the step's end; the rest of the head's with the last
    // layer's (its reduce-scatter in flight during that layer's backward), or two layers' (one
    // reduce-scatter in flight).
    std::vector<size_t> layer;
    for (int l = 0; l < layers_; ++l) layer.push_back(pages(groups_[static_cast<size_t>(l + 1)]));
    std::sort(layer.rbegin(), layer.rend());
    const size_t l0 = layer.size() > 0 ? layer[0] : 0, l1 = layer.size() > 1 ? layer[1] : 0;
    std::vector<int> kept, rest;
    for (int r : groups_[static_cast<size_t>(layers_ + 1)]) (embedding_range(static_cast<size_t>(r)) ? kept : rest).push_back(r);
    return pages(kept) + std::max(pages(rest) + l0, l0 + l1);
  }
  // Weights whole at once: a group and the next one the model asks for (the prefetch), ranges once.
  std::vector<int> order{kEmbedGroup};
  for (int l = 0; l < layers_; ++l) order.push_back(l);
  order.push_back(layers_);
  for (int l = layers_ - 1; l >= 0; --l) order.push_back(l);
  size_t most = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    std::vector<int> live = groups_[static_cast<size_t>(order[i] + 1)];
    if (i + 1 < order.size())
      for (int r : groups_[static_cast<size_t>(order[i + 1] + 1)])
        if (std::find(live.begin(), live.end(), r) == live.end()) live.push_back(r);
    most = std::max(most, pages(live));
  }
  return most;
}

size_t ParamShards::outer_bytes(std::span<float> buf, size_t begin, size_t end) const {
  size_t bytes = 0;
  for (auto [b, e] : {std::pair{begin, std::min(end, lo_)}, std::pair{std::max(begin, hi_), end}}) {
    if (e <= b) continue;
    const auto [s, f] = whole_pages(buf.data() + b, e - b);
    bytes += static_cast<size_t>(f - s) * sizeof(float);
  }
  return bytes;
}

Status ParamShards::bring_in(size_t k) {
  if (params_pool_) (void)params_pool_->map(k, ranges_[k].begin, ranges_[k].end);
  return {};
}

Status ParamShards::drop_params(size_t k) {
  if (params_pool_) params_pool_->unmap(k);
  drop(params_, ranges_[k].begin, ranges_[k].end);  // (what the pool put back holds no pages: only the edges change)
  return {};
}

Status ParamShards::grads_range_in(size_t k) {
  if (!grads_pool_) return {};
  for (const auto& [at, n] : grads_pool_->map(k, ranges_[k].begin, ranges_[k].end))
    if (n > 0) std::memset(at, 0, n);  // (pool pages hold what they last held)
  return {};
}

Status ParamShards::grads_in(int g) {
  if (!accumulating_) return {};
  for (int i : group(g)) {
    const auto k = static_cast<size_t>(i);
    if (grads_live_[k]) continue;
    grads_live_[k] = 1;
    TROUPE_TRY(grads_range_in(k));
  }
  return {};
}

Status ParamShards::drop_grads(size_t k) {
  if (grads_pool_) grads_pool_->unmap(k);
  drop(grads_, ranges_[k].begin, ranges_[k].end);
  return {};
}

bool ParamShards::embedding_range(size_t k) const {
  const std::vector<int>& embedding = groups_[0];
  return std::find(embedding.begin(), embedding.end(), static_cast<int>(k)) != embedding.end();
}

std::vector<size_t> ParamShards::range_bounds(size_t k) const {
  return clamp_bounds(bounds_, ranges_[k].begin, ranges_[k].end);
}

std::span<float> ParamShards::part(std::span<float> buf, size_t k) const {
  return buf.subspan(ranges_[k].begin, ranges_[k].end - ranges_[k].begin);
}

Status ParamShards::gather_range(size_t k) { return comm_.all_gather(part(params_, k), range_bounds(k)); }

Result<std::unique_ptr<PendingCollective>> ParamShards::start_gather_range(size_t k) {
  return comm_.start_all_gather(part(params_, k), range_bounds(k));
}

Status ParamShards::reduce_range(size_t k) { return comm_.reduce_scatter_sum(part(grads_, k), range_bounds(k)); }

Result<std::unique_ptr<PendingCollective>> ParamShards::start_reduce_range(size_t k) {
  return comm_.start_reduce_scatter_sum(part(grads_, k), range_bounds(k));
}

Status ParamShards::gather_whole() { return comm_.all_gather(params_, bounds_); }

Status ParamShards::gather_whole_to(int root) { return comm_.gather(params_, bounds_, root); }

Status ParamShards::gather(size_t k) {
  TROUPE_TRY(bring_in(k));
  return gather_range(k);
}

void ParamShards::drop(std::span<float> buf, size_t begin, size_t end) const {
  if (begin < std::min(end, lo_)) drop_span(buf.data() + begin, std::min(end, lo_) - begin);
  if (std::max(begin, hi_) < end) drop_span(buf.data() + std::max(begin, hi_), end - std::max(begin, hi_));
}

int ParamShards::next_group(int g) const {
  if (g == kEmbedGroup) return layers_ > 0 ? 0 : layers_;
  if (g == layers_) return layers_ > 0 ? layers_ - 1 : -3;
  if (backward_) return g > 0 ? g - 1 : -3;
  return g + 1;
}

Status ParamShards::start_gathers(int g) {
  if (g < kEmbedGroup) return {};
  for (int i : group(g)) {
    const auto k = static_cast<size_t>(i);
    Range& r = ranges_[k];
    if (r.held > 0 || gathering_[k]) continue;
    TROUPE_TRY(bring_in(k));
    TROUPE_ASSIGN_OR_RETURN(gathering_[k], start_gather_range(k));
  }
  return {};
}

Status ParamShards::finish_scatter(size_t i) {
  TROUPE_TRY(scattering_[i]->wait());
  scattering_[i].reset();
  return drop_grads(i);
}

Status ParamShards::progress() {
  for (auto& op : gathering_) {
    if (!op) continue;
    TROUPE_ASSIGN_OR_RETURN(const bool arrived, op->test());
    (void)arrived;  // (need() waits for it; a finished wait costs nothing)
  }
  for (size_t i = 0; i < scattering_.size(); ++i) {
    if (!scattering_[i]) continue;
    TROUPE_ASSIGN_OR_RETURN(const bool finished, scattering_[i]->test());
    if (finished) TROUPE_TRY(finish_scatter(i));
  }
  return {};
}

Status ParamShards::settle() {
  const BlockingCall label("learner.shard parameters: the layers' collectives still in flight");
  for (auto& op : gathering_)
    if (op) {
      TROUPE_TRY(op->wait());
      op.reset();
    }
  for (size_t i = 0; i < scattering_.size(); ++i)
    if (scattering_[i]) TROUPE_TRY(finish_scatter(i));
  return {};
}

Status ParamShards::need(int g) {
  if (!active_) return {};
  if (g < kEmbedGroup || g > layers_)
    return make_error(ErrorCode::internal, "learner.shard parameters: the model asked for group " +
                                               std::to_string(g) + " of a table of " + std::to_string(layers_) +
                                               " layers");
  if (g == kEmbedGroup) backward_ = false;
  const auto label = gather_label(g, layers_);
  for (int i : group(g)) {
    const auto k = static_cast<size_t>(i);
    if (ranges_[k].held++ > 0) continue;
    if (gathering_[k]) {  // prefetched: wait for what is still on its way
      TROUPE_TRY(gathering_[k]->wait());
      gathering_[k].reset();
    } else {
      TROUPE_TRY(gather(k));
    }
  }
  // The gradients this group's backward writes next: the head's from its forward on (its backward
  // follows), a layer's from its backward's need.
  if (g == layers_ || (backward_ && g >= 0)) TROUPE_TRY(grads_in(g));
  if (prefetch_) TROUPE_TRY(start_gathers(next_group(g)));
  if (g == layers_) backward_ = true;
  return progress();
}

Status ParamShards::done(int g, bool backward) {
  if (!active_) return {};
  for (int i : group(g)) {
    Range& r = ranges_[static_cast<size_t>(i)];
    if (r.held > 0 && --r.held == 0) TROUPE_TRY(drop_params(static_cast<size_t>(i)));
  }
  if (!backward || !last_ || g < 0 || g > layers_) return progress();
  // At most one reduce-scatter in flight (layer g+1's or the head's, which overlapped this layer's
  // backward), so at most two layers' gradients are whole at once.
  {
    const BlockingCall previous = scatter_label(g + 1, layers_);
    for (size_t i = 0; i < scattering_.size(); ++i)
      if (scattering_[i]) TROUPE_TRY(finish_scatter(i));
  }
  const BlockingCall label = scatter_label(g, layers_);
  for (int i : group(g)) {  // the group's gradient is complete on every rank: sum this rank's shard of it
    const auto k = static_cast<size_t>(i);
    Range& r = ranges_[k];
    // (a tied head's embedding: its gradient is complete only after the embedding's backward, the
    // last; reduce_rest sums it)
    if (r.reduced || embedding_range(k)) continue;
    r.reduced = true;
    if (!prefetch_) {
      TROUPE_TRY(reduce_range(k));
      TROUPE_TRY(drop_grads(k));
      continue;
    }
    TROUPE_ASSIGN_OR_RETURN(scattering_[k], start_reduce_range(k));
  }
  return progress();
}

Status ParamShards::phantom_pass() {
  TROUPE_TRY(phantom_forward());
  TROUPE_TRY(done(layers_, true));
  for (int l = layers_ - 1; l >= 0; --l) {
    TROUPE_TRY(need(l));
    TROUPE_TRY(done(l, true));
  }
  return {};
}

Status ParamShards::phantom_forward() {
  TROUPE_TRY(need(kEmbedGroup));
  TROUPE_TRY(done(kEmbedGroup, false));
  for (int l = 0; l < layers_; ++l) {
    TROUPE_TRY(need(l));
    TROUPE_TRY(done(l, false));
  }
  return need(layers_);
}

Status ParamShards::gather_all() {
  TROUPE_TRY(settle());
  const BlockingCall label("learner.shard parameters: the all-gather of the whole weights");
  for (auto& r : ranges_) r.held = 0;
  return gather_whole();
}

Status ParamShards::gather_to(int root) {
  TROUPE_TRY(settle());
  const BlockingCall label("learner.shard parameters: the gather of the whole weights to rank", root);
  for (auto& r : ranges_) r.held = 0;
  TROUPE_TRY(gather_whole_to(root));
  if (comm_.rank() != root) return release_all();
  return {};
}

std::vector<std::pair<size_t, size_t>> ParamShards::group_ranges(int g) const {
  std::vector<std::pair<size_t, size_t>> out;
  if (g < kEmbedGroup || g > layers_) return out;
  for (int i : groups_[static_cast<size_t>(g + 1)]) out.emplace_back(ranges_[static_cast<size_t>(i)].begin,
                                                                     ranges_[static_cast<size_t>(i)].end);
  return out;
}

Status ParamShards::release_all() {
  TROUPE_TRY(settle());
  for (size_t k = 0; k < ranges_.size(); ++k) {
    ranges_[k].held = 0;
    TROUPE_TRY(drop_params(k));
  }
  return {};
}

Status ParamShards::zero_grads() {
  TROUPE_TRY(settle());
  for (auto& r : ranges_) r.reduced = false;
  if (!layered_) return {};
  grads_live_.assign(ranges_.size(), 0);
  accumulating_ = true;
  return zero_grad_memory();
}

Status ParamShards::zero_grad_memory() {
  for (size_t k = 0; k < ranges_.size(); ++k)
    if (grads_pool_) grads_pool_->unmap(k);  // (none left by a step that ran to its end)
  // This rank's shard is zeroed where it is (its pages stay: the step's sum lands there); the rest
  // goes back to the OS, its pages reading zero when touched (the edges zeroed here).
  auto zero_outside = [](float* p, size_t n) {
    const auto [s, e] = drop_pages(p, n);
    std::fill(p, s, 0.0f);
    std::fill(e, p + n, 0.0f);
  };
  zero_outside(grads_.data(), lo_);
  std::fill(grads_.begin() + static_cast<std::ptrdiff_t>(lo_), grads_.begin() + static_cast<std::ptrdiff_t>(hi_), 0.0f);
  zero_outside(grads_.data() + hi_, grads_.size() - hi_);
  return {};
}

Status ParamShards::reduce_rest() {
  TROUPE_TRY(settle());
  const BlockingCall label("learner.shard parameters: the gradient reduce-scatter of the embedding and head");
  accumulating_ = false;
  for (size_t k = 0; k < ranges_.size(); ++k) {
    Range& r = ranges_[k];
    if (r.reduced) continue;
    TROUPE_TRY(reduce_range(k));
    r.reduced = true;
    TROUPE_TRY(drop_grads(k));
  }
  return {};
}

}  // namespace troupe::learner
