// learner.shard parameters (ZeRO-3): a rank's parameters and gradients kept as its shard, each
// group of weights (embedding, decoder layer, head) gathered from the other ranks just before use
// and dropped after; the next group's gather and the last layer's gradient reduce-scatter run while
// the current group computes. Invariant: the values the model reads are the whole buffer's bits, and
// every rank starts the same collectives in the same order (the fixed ParamHook sequence).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "troupe/learner/communicator.h"
#include "troupe/learner/page_pool.h"
#include "troupe/policy/model.h"

namespace troupe::learner {

class ParamShards : public policy::ParamHook {
 public:
  // layered: groups from the tensor table's Hugging Face names (model.embed_tokens, model.layers.N.,
  // the rest the head; the embedding joins the head when there is no lm_head.weight); otherwise
  // one group of everything, gathered by begin/end of a step only.
  ParamShards(std::span<float> params, std::span<float> grads, const std::vector<policy::TensorSpec>& table,
              std::vector<size_t> bounds, Communicator& comm, bool layered)
      : ParamShards(params, grads, table, std::move(bounds), comm, layered, layered) {}
  ~ParamShards() override;  // (the pools put ordinary pages back where theirs are still mapped)

  bool layered() const { return layered_; }
  int num_layers() const { return layers_; }
  // The hook acts only while active (the loss micro-batches of a step); inactive it is a no-op.
  void set_active(bool on) { active_ = on; }
  // Prefetch (default on): need(g) starts the gather of the group the model asks for next (forward
  // g+1, backward g-1) without waiting, and done(l, true) starts layer l's reduce-scatter without
  // waiting; each is waited for where its values are next used (a reduce-scatter at the latest when
  // the next one starts). Off: every collective blocks. The values are the same bits either way. At
  // most two groups (and two layers' gradients) are whole at once with it, one without.
  void set_prefetch(bool on) { prefetch_ = on; }
  bool prefetch() const { return prefetch_; }
  // done(l, true) of the last micro-batch reduce-scatters layer l's gradient and drops the rest of it
  // (done(L, true) the head's, but for a tied head's embedding, whose backward comes last).
  void set_last_micro_batch(bool last) { last_ = last; }
  Status need(int group) override;
  Status done(int group, bool backward) override;
  // The hook calls of one forward + backward with nothing computed (a rank with fewer micro-batches
  // than another still takes part in each gather and reduce-scatter).
  Status phantom_pass();
  // The hook calls of one forward alone (no backward): the head stays held until release_all.
  Status phantom_forward();
  // Every rank's shard, whole on every rank (one all-gather).
  Status gather_all();
  // Whole on rank `root` only; the other ranks drop what is not theirs.
  Status gather_to(int root);
  // Drops every value outside this rank's shard (their pages go back to the OS), after waiting for
  // whatever is still in flight.
  Status release_all();
  // Waits for every gather and reduce-scatter still in flight.
  Status settle();
  // The [begin, end) ranges of the buffer that group g gathers (kEmbedGroup, 0..L-1, L), and this
  // rank's shard [lo, hi).
  std::vector<std::pair<size_t, size_t>> group_ranges(int g) const;
  std::pair<size_t, size_t> shard() const { return {lo_, hi_}; }
  // A new accumulation: layered, zeroes this rank's shard of the gradients in place and the rest
  // without touching its pages (they come back zero on use); not layered, the caller zeroes the model's gradients (PolicyModel::zero_grads).
  Status zero_grads();
  // Reduce-scatters every gradient range not yet reduced in this step, drops the non-owned part.
  Status reduce_rest();
  // Every gradient range resident and zero (a step whose backward runs without the hook, on the
  // whole weights: a streamed step); host pages fault in on their own, so only a device needs it.
  virtual Status grads_whole() { return {}; }

 protected:
  struct Range {
    size_t begin, end;
    int held = 0;
    bool reduced = false;
  };
  // The schedule above runs on the memory and the collectives below. This class's are the host's
  // (spans over comm, page pools); DeviceParamShards (device_shards.h) puts them on a device
  // model's sparse arena and its device collective. `pools`: make the host's page pools.
  ParamShards(std::span<float> params, std::span<float> grads, const std::vector<policy::TensorSpec>& table,
              std::vector<size_t> bounds, Communicator& comm, bool layered, bool pools);
  virtual Status bring_in(size_t k);                // range k's non-owned weights about to be gathered
  virtual Status drop_params(size_t k);             // ... dropped (its edges NaN)
  virtual Status grads_range_in(size_t k);          // range k's gradient about to be written: resident, zero
  virtual Status drop_grads(size_t k);              // range k's non-owned gradient dropped (its edges NaN)
  virtual Status zero_grad_memory();                // every gradient 0, the non-owned part not resident
  virtual Status gather_range(size_t k);            // blocking all-gather of range k's weights
  virtual Result<std::unique_ptr<PendingCollective>> start_gather_range(size_t k);
  virtual Status reduce_range(size_t k);            // blocking reduce-scatter of range k's gradient
  virtual Result<std::unique_ptr<PendingCollective>> start_reduce_range(size_t k);
  virtual Status gather_whole();                    // every rank's shard whole on every rank
  virtual Status gather_whole_to(int root);         // ... on `root`
  std::vector<size_t> range_bounds(size_t k) const;  // bounds_ clamped to range k, from 0
  const std::vector<Range>& ranges() const { return ranges_; }
  bool embedding_range(size_t k) const;  // range k is the embedding's (a tied head's too)
  const std::vector<size_t>& bounds() const { return bounds_; }
  Communicator& comm() { return comm_; }

 private:
  Status gather(size_t k);                          // bring_in, then gather_range
  std::span<float> part(std::span<float> buf, size_t k) const;  // range k of a host buffer
  Status grads_in(int g);                           // group g's gradients about to be written
  size_t pool_bytes(bool grads) const;              // the most non-owned whole-page bytes whole at once
  size_t outer_bytes(std::span<float> buf, size_t begin, size_t end) const;  // its whole pages outside the shard
  Status start_gathers(int g);                      // the prefetch of group g (its ranges not held)
  Status progress();                                // MPI_Test on what is in flight
  Status finish_scatter(size_t i);                  // waits for range i's reduce-scatter, drops the rest
  int next_group(int g) const;                      // the group need() asks for after g; -3 none
  void drop(std::span<float> buf, size_t begin, size_t end) const;  // the non-owned part of [begin, end)
  std::vector<int>& group(int g) { return groups_[static_cast<size_t>(g + 1)]; }

  std::span<float> params_, grads_;
  std::vector<size_t> bounds_;
  Communicator& comm_;

 protected:
  size_t lo_ = 0, hi_ = 0;  // this rank's shard

 private:
  bool layered_ = false, active_ = false, last_ = false, prefetch_ = true, backward_ = false;
  int layers_ = 0;
  std::vector<Range> ranges_;             // disjoint, covering the buffer
  std::vector<std::vector<int>> groups_;  // embedding, layers 0..L-1, head: indices into ranges_
  // Per range: its gather started ahead (prefetch) and its gradient's reduce-scatter, while in flight.
  std::vector<std::unique_ptr<PendingCollective>> gathering_, scattering_;
  // Reused pages (null: none, the pages fault in): the layered gathers write into params_pool_, the
  // backward's gradients of a range not yet written in this accumulation into grads_pool_ (zeroed).
  std::unique_ptr<PooledRanges> params_pool_, grads_pool_;
  std::vector<char> grads_live_;  // per range: its gradient written (or about to be) in this accumulation
  bool accumulating_ = false;     // from zero_grads to reduce_rest
};

}  // namespace troupe::learner
