// When a decode step of DecodeSlots runs as a recorded graph (YAML policy.decode_graphs; a backend
// with graphs, cuda): host-only decisions, tested without a GPU (policy.decode_graph). Invariant: a
// graph is replayed only under the key it was recorded with -- rows, KV-cache length, the weights'
// write count and every device buffer the step reads or writes -- so a replay queues the ops an
// eager step with that key queues; a new key runs eagerly until it has settled (seen `settle`
// steps in a row), and one failed recording turns graphs off for the slots (eager from then on).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe::policy {

struct DecodeGraphKey {
  int rows = 0;            // sequences decoded this step (the ops' T)
  int cache_len = 0;       // the KV cache's positions per slot
  uint64_t weights = 0;    // Model::params_writes(): a write may change the backend's bf16 copies
  std::vector<const void*> buffers;  // every device buffer the step touches (a grow moves one)
  bool operator==(const DecodeGraphKey&) const = default;
};

enum class DecodeGraphAction { eager, record, replay };

class DecodeGraphPlan {
 public:
  struct Step {
    DecodeGraphAction action = DecodeGraphAction::eager;
    uint64_t id = 0;            // record: the id to record into; replay: the graph to launch
    std::vector<uint64_t> drop;  // graphs the backend should free first (evicted, least recently used)
  };
  explicit DecodeGraphPlan(bool enabled, int settle = 2, size_t max_graphs = 8)
      : enabled_(enabled), settle_(settle < 1 ? 1 : settle), max_graphs_(max_graphs < 1 ? 1 : max_graphs) {}

  // What the step under `key` does.
  Step next(const DecodeGraphKey& key) {
    Step s;
    if (!enabled_) return s;
    ++clock_;
    for (auto& g : graphs_)
      if (g.key == key) {
        g.used = clock_;
        s.action = DecodeGraphAction::replay;
        s.id = g.id;
        return s;
      }
    if (!(key == last_)) last_ = key, seen_ = 0;
    if (++seen_ < settle_) return s;
    if (graphs_.size() >= max_graphs_) {  // room for the new one: the least recently used goes
      size_t lru = 0;
      for (size_t i = 1; i < graphs_.size(); ++i)
        if (graphs_[i].used < graphs_[lru].used) lru = i;
      s.drop.push_back(graphs_[lru].id);
      graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(lru));
    }
    s.action = DecodeGraphAction::record;
    s.id = ++next_id_;
    graphs_.push_back({key, s.id, clock_});
    return s;
  }
  // The recording of `id` failed (`why`): graphs are off from now on; returns every graph to free.
  std::vector<uint64_t> record_failed(uint64_t id, std::string why) {
    (void)id;
    enabled_ = false;
    why_off_ = std::move(why);
    std::vector<uint64_t> all;
    for (const auto& g : graphs_) all.push_back(g.id);
    graphs_.clear();
    return all;
  }
  // A replay of `id` was refused (the backend's workspaces moved): forget it; the key settles again.
  void replay_refused(uint64_t id) {
    for (size_t i = 0; i < graphs_.size(); ++i)
      if (graphs_[i].id == id) graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(i)), --i;
    seen_ = 0;
  }
  std::vector<uint64_t> ids() const {
    std::vector<uint64_t> out;
    for (const auto& g : graphs_) out.push_back(g.id);
    return out;
  }
  bool enabled() const { return enabled_; }
  const std::string& why_off() const { return why_off_; }
  size_t graphs() const { return graphs_.size(); }

 private:
  struct Held {
    DecodeGraphKey key;
    uint64_t id;
    uint64_t used;
  };
  bool enabled_;
  int settle_;
  size_t max_graphs_;
  std::vector<Held> graphs_;
  DecodeGraphKey last_;
  int seen_ = 0;
  uint64_t clock_ = 0, next_id_ = 0;
  std::string why_off_;
};

}  // namespace troupe::policy
