// The node's actors: cells by local id (a lock-free slot array), registered names and their
// aliases (the ids ActorSystem::named hands out), and the placement table that maps a name to
// the node it lives on. Cells are owned here until the system is destroyed; a stopped cell stays
// findable (its state says it is stopped).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actor_cell.h"

namespace troupe::runtime {

class ActorTable {
 public:
  static constexpr std::size_t kMaxActors = 1u << 16;

  explicit ActorTable(std::uint32_t node_id);

  // The alias local id of `name` (top bit set), the same on every node.
  static std::uint32_t alias_of(std::string_view name);

  std::uint32_t next_local() { return next_local_.fetch_add(1); }
  ActorCell* add(std::unique_ptr<ActorCell> cell);  // findable from now on
  ActorCell* find(std::uint32_t local) const;       // a local id or an alias; nullptr if none
  std::vector<ActorCell*> all() const;

  Status register_name(const std::string& name, ActorId id);
  Result<ActorId> lookup(std::string_view name) const;  // local name first, then placement
  void set_placement(std::map<std::string, std::uint32_t> name_to_node);

 private:
  std::uint32_t node_id_;
  mutable std::mutex cells_mu_;
  std::vector<std::unique_ptr<ActorCell>> owned_;
  std::unique_ptr<std::atomic<ActorCell*>[]> slots_ { new std::atomic<ActorCell*>[ kMaxActors ] };
  std::atomic<std::uint32_t> next_local_{1};
  mutable std::shared_mutex names_mu_;
  std::unordered_map<std::string, std::uint32_t> names_;      // name -> local id
  std::unordered_map<std::uint32_t, std::uint32_t> aliases_;  // alias -> local id
  std::map<std::string, std::uint32_t> placement_;
};

}  // namespace troupe::runtime
