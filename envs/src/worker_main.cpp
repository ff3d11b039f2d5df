// troupe-env-worker: the isolated process an env actor runs built-ins and plug-ins in, so a crash
// or hang kills only this process. Same protocol as `troupe env serve`.
//   troupe-env-worker --bind ADDR --env (BUILTIN | PLUGIN.so) [--config JSON] [--parent-pid PID]
//                     [--max-message-bytes N]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "troupe/envs/remote.h"

int main(int argc, char** argv) {
  std::string bind, env, config;
  int parent = 0;
  long long max_bytes = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "troupe-env-worker: error: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--bind") bind = value();
    else if (a == "--env") env = value();
    else if (a == "--config") config = value();
    else if (a == "--parent-pid") parent = std::atoi(value().c_str());
    else if (a == "--max-message-bytes") max_bytes = std::atoll(value().c_str());
    else {
      std::fprintf(stderr, "troupe-env-worker: error: unknown argument '%s'\n"
                           "usage: troupe-env-worker --bind ADDR --env (BUILTIN|PLUGIN.so) [--config JSON] [--parent-pid PID] [--max-message-bytes N]\n",
                   a.c_str());
      return 2;
    }
  }
  if (bind.empty() || env.empty()) {
    std::fprintf(stderr, "troupe-env-worker: error: --bind and --env are required\n");
    return 2;
  }
  auto local = troupe::envs::make_served_env(env, config);
  if (!local.ok()) {
    std::fprintf(stderr, "troupe-env-worker: error: %s\n", local.error().message.c_str());
    return troupe::exit_code_for(local.error().code);
  }
  troupe::envs::ServeOptions opts;
  opts.bind = bind;
  opts.parent_pid = parent;
  opts.poll_ms = 50;
  opts.max_message_bytes = max_bytes;
  auto st = troupe::envs::serve_env(std::move(local).value(), opts);
  if (!st.ok()) {
    std::fprintf(stderr, "troupe-env-worker: error: %s\n", st.error().message.c_str());
    return troupe::exit_code_for(st.error().code);
  }
  return 0;
}
