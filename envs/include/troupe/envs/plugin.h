// Loading env plug-ins (.so implementing troupe/env_plugin.h) by path. A loaded library stays
// mapped while any Env made from it lives. Every failure (no file, no symbol, ABI mismatch, bad
// JSON from the plug-in) is an error naming the library path.
#pragma once

#include <memory>
#include <string>

#include "troupe/envs/env.h"
#include "troupe/envs/registry.h"

namespace troupe::envs {

class PluginLibrary;

// dlopen(path) and check the table; the result can make any number of Env instances.
Result<std::shared_ptr<PluginLibrary>> load_plugin(const std::string& path);
Result<std::unique_ptr<Env>> make_plugin_env(const std::shared_ptr<PluginLibrary>& lib, const json& config);
// A factory (registry style) for one library: each call creates one instance with `config`.
Result<EnvFactory> plugin_factory(const std::string& path);

// The plug-in's declared name/version (from the table).
std::string plugin_name(const PluginLibrary& lib);

}  // namespace troupe::envs
