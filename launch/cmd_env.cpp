// `troupe env serve (PLUGIN.so | BUILTIN) --bind ADDR`: serve an environment over the remote env protocol.
#include <memory>

#include "troupe/launch/commands.h"

namespace troupe::launch {

Command add_env_command(CLI::App& root) {
  struct Opts {
    std::string env, bind;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("env", "Environment tools");
  app->require_subcommand(1);
  auto* serve = app->add_subcommand("serve", "Serve an environment (plug-in .so or built-in name) over the remote env protocol");
  serve->add_option("env", o->env, "PLUGIN.so path or built-in env name")->required();
  serve->add_option("--bind", o->bind, "ZeroMQ address to bind, e.g. tcp://127.0.0.1:5555 or ipc:///tmp/env.sock")->required();
  return {app, [o]() { return report_error(make_error(ErrorCode::internal, "troupe env serve is not implemented yet")); }};
}

}  // namespace troupe::launch
