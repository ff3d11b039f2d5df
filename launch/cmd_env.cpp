// `troupe env serve (PLUGIN.so | BUILTIN) --bind ADDR [--config JSON]`: serves an environment over
// the remote env protocol (envs/PROTOCOL.md) until SIGINT/SIGTERM or a shutdown request, so a C++
// plug-in or a built-in can run as its own process like any remote env.
#include <atomic>
#include <csignal>
#include <memory>

#include "troupe/envs/registry.h"
#include "troupe/envs/remote.h"
#include "troupe/launch/commands.h"

namespace troupe::launch {

namespace {
std::atomic<bool> g_env_serve_stop{false};
void on_env_serve_signal(int) { g_env_serve_stop = true; }
}  // namespace

Command add_env_command(CLI::App& root) {
  struct Opts {
    std::string env, bind, config;
    long long max_message_bytes = -1;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("env", "Environment tools");
  app->require_subcommand(1);
  std::string builtins;
  for (const auto& n : envs::EnvRegistry::global().names()) builtins += (builtins.empty() ? "" : ", ") + n;
  auto* serve = app->add_subcommand("serve", "Serve an environment (plug-in .so or built-in name) over the remote env protocol");
  serve->add_option("env", o->env, "PLUGIN.so path or built-in env name (" + builtins + ")")->required();
  serve->add_option("--bind", o->bind, "ZeroMQ address to bind, e.g. tcp://127.0.0.1:5555 or ipc:///tmp/env.sock")->required();
  serve->add_option("--config", o->config, "The env's config as a JSON object, e.g. '{\"digits\": 2}'");
  serve->add_option("--max-message-bytes", o->max_message_bytes,
                    "Largest request accepted (a larger one drops its connection unread; default: no limit)")
      ->check(CLI::PositiveNumber);
  return {app, [o]() -> int {
            auto local = envs::make_served_env(o->env, o->config);
            if (!local.ok()) return report_error(local.error());
            std::signal(SIGINT, on_env_serve_signal);
            std::signal(SIGTERM, on_env_serve_signal);
            envs::ServeOptions opts;
            opts.bind = o->bind;
            opts.stop = &g_env_serve_stop;
            opts.announce = true;
            opts.max_message_bytes = o->max_message_bytes;
            auto st = envs::serve_env(std::move(local).value(), opts);
            if (!st.ok()) return report_error(st.error());
            return 0;
          }};
}

}  // namespace troupe::launch
