// Entry point of the `troupe` binary: builds the CLI from every subcommand and runs the chosen one.
// Only launch/ turns errors into exit codes; a user never sees a stack trace for bad input.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/base/build_config.h"
#include "troupe/launch/commands.h"

namespace troupe::launch {

int report_error(const Error& error) {
  std::fprintf(stderr, "troupe: error: %s\n", error.message.c_str());
  return exit_code_for(error.code);
}

}  // namespace troupe::launch

int main(int argc, char** argv) {
  // OpenMP workers that spin between parallel regions cost several times the compute on a busy
  // machine (sampling up to 14x slower on 2 shared cores; a bounded spin, GOMP_SPINCOUNT=10000, made
  // the quickstart 14-21% slower and a batch-1 QLoRA decode step ~1.5x slower on the loaded 2-core
  // VM, though ~25% faster on an idle one). So unless the user chose OMP_WAIT_POLICY or
  // GOMP_SPINCOUNT we set PASSIVE. libgomp reads both when it loads, before main, so we set it and
  // re-execute ourselves once. (A quantized base's decode steps run on the kernels' own decode pool,
  // which spins a bounded time between a token's jobs whatever this says: kernels/cpu/decode_pool.h.)
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: then run with libgomp's defaults
  }
  using namespace troupe::launch;
  if (troupe::Status registered = troupe::actors::register_messages(); !registered.ok())
    return report_error(registered.error());  // two message types share an id: a bug, caught before anything runs
  CLI::App app{"troupe — actor-based RL post-training (GRPO, SFT) for MoE language models"};
  app.set_version_flag("--version", TROUPE_VERSION_STRING);
  app.require_subcommand(1);
  std::vector<Command> commands = {
      add_run_command(app),   add_validate_command(app), add_eval_command(app),
      add_report_command(app), add_bench_command(app),   add_env_command(app),
      add_generate_command(app), add_score_command(app), add_keygen_command(app),
      add_import_command(app), add_export_command(app), add_serve_command(app),
      add_plan_command(app),  add_checkpoint_command(app), add_join_command(app), add_status_command(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;  // bad command line is bad input
  }
  try {
    for (auto& c : commands) {
      if (c.app->parsed()) return c.run();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe: internal error: %s\n", e.what());
    return 1;
  }
  return 1;
}
