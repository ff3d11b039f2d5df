// ActorTable: cells by local id, names, aliases and placement (see actor_table.h).
#include "actor_table.h"

namespace troupe::runtime {

namespace {
constexpr std::uint32_t kAliasBit = 0x80000000u;
}  // namespace

ActorTable::ActorTable(std::uint32_t node_id) : node_id_(node_id) {
  for (std::size_t i = 0; i < kMaxActors; ++i) slots_[i].store(nullptr, std::memory_order_relaxed);
}

std::uint32_t ActorTable::alias_of(std::string_view name) {
  std::uint32_t h = 2166136261u;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return (h & 0x7fffffffu) | kAliasBit;
}

ActorCell* ActorTable::add(std::unique_ptr<ActorCell> cell) {
  ActorCell* raw = cell.get();
  {
    std::lock_guard lock(cells_mu_);
    owned_.push_back(std::move(cell));
  }
  slots_[raw->id.local].store(raw, std::memory_order_release);
  return raw;
}

ActorCell* ActorTable::find(std::uint32_t local) const {
  if (local & kAliasBit) {
    std::shared_lock lock(names_mu_);
    auto it = aliases_.find(local);
    if (it == aliases_.end()) return nullptr;
    local = it->second;
  }
  if (local == 0 || local >= kMaxActors) return nullptr;
  return slots_[local].load(std::memory_order_acquire);
}

std::vector<ActorCell*> ActorTable::all() const {
  std::vector<ActorCell*> cells;
  std::lock_guard lock(cells_mu_);
  for (auto& c : owned_) cells.push_back(c.get());
  return cells;
}

Status ActorTable::register_name(const std::string& name, ActorId id) {
  if (id.node != node_id_)
    return invalid_input("runtime: register_name('" + name + "'): " + to_string(id) + " is not on this node");
  std::uint32_t alias = alias_of(name);
  std::unique_lock lock(names_mu_);
  if (names_.count(name))
    return invalid_input("runtime: actor name '" + name + "' is already registered on node " +
                         std::to_string(node_id_));
  if (aliases_.count(alias))
    return invalid_input("runtime: actor name '" + name + "' collides with another name's hash; rename it");
  names_[name] = id.local;
  aliases_[alias] = id.local;
  return {};
}

Result<ActorId> ActorTable::lookup(std::string_view name) const {
  std::shared_lock lock(names_mu_);
  auto it = names_.find(std::string(name));
  if (it != names_.end()) return ActorId{node_id_, it->second};
  auto pl = placement_.find(std::string(name));
  if (pl != placement_.end()) return ActorId{pl->second, alias_of(name)};
  return invalid_input("runtime: no actor named '" + std::string(name) + "' on node " +
                       std::to_string(node_id_) + " and none in the placement table");
}

void ActorTable::set_placement(std::map<std::string, std::uint32_t> name_to_node) {
  std::unique_lock lock(names_mu_);
  placement_ = std::move(name_to_node);
}

}  // namespace troupe::runtime
