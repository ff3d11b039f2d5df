// The env registry: built-in name -> factory taking that env's JSON config. Built-ins are
// registered explicitly (register_builtin_envs), never by static initializers, so linking
// troupe::envs statically can never silently drop one.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/envs/env.h"

namespace troupe::envs {

using EnvFactory = std::function<Result<std::unique_ptr<Env>>(const json& config)>;

class EnvRegistry {
 public:
  // The process-wide registry, with every built-in already in it.
  static EnvRegistry& global();

  Status add(const std::string& name, EnvFactory factory);  // error if the name is taken
  bool contains(const std::string& name) const;
  // Unknown name -> invalid_input listing the known ones; bad config -> the env's own error.
  Result<std::unique_ptr<Env>> create(const std::string& name, const json& config) const;
  Result<EnvFactory> factory(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, EnvFactory> factories_;
};

// arithmetic, countdown, dataset, guess_number, calculator (see builtin.h).
void register_builtin_envs(EnvRegistry& registry);

}  // namespace troupe::envs
