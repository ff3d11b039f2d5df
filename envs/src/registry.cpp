// The env registry. global() is built on first use with the built-ins; add() is thread-safe.
#include "troupe/envs/registry.h"

#include "troupe/envs/builtin.h"

namespace troupe::envs {

EnvRegistry& EnvRegistry::global() {
  static EnvRegistry* registry = [] {
    auto* r = new EnvRegistry();
    register_builtin_envs(*r);
    return r;
  }();
  return *registry;
}

Status EnvRegistry::add(const std::string& name, EnvFactory factory) {
  std::lock_guard lock(mu_);
  if (factories_.count(name)) return invalid_input("env '" + name + "' is already registered");
  factories_[name] = std::move(factory);
  return {};
}

bool EnvRegistry::contains(const std::string& name) const {
  std::lock_guard lock(mu_);
  return factories_.count(name) > 0;
}

Result<EnvFactory> EnvRegistry::factory(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::string known;
    for (const auto& [k, f] : factories_) known += (known.empty() ? "" : ", ") + k;
    return invalid_input("unknown built-in env '" + name + "' (known: " + known + ")");
  }
  return it->second;
}

Result<std::unique_ptr<Env>> EnvRegistry::create(const std::string& name, const json& config) const {
  TROUPE_ASSIGN_OR_RETURN(EnvFactory f, factory(name));
  return f(config);
}

std::vector<std::string> EnvRegistry::names() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const auto& [k, f] : factories_) out.push_back(k);
  return out;
}

void register_builtin_envs(EnvRegistry& registry) {
  (void)registry.add("arithmetic", make_arithmetic_env);
  (void)registry.add("countdown", make_countdown_env);
  (void)registry.add("dataset", make_dataset_env);
  (void)registry.add("guess_number", make_guess_number_env);
  (void)registry.add("calculator", make_calculator_env);
}

}  // namespace troupe::envs
