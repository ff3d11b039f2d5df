// `troupe run`, `troupe validate`, `troupe eval`: the CLI of the experiment launcher (run.h does
// the work); a config that does not load prints its errors and exits 2.
#include <memory>
#include <optional>
#include <vector>

#include <cstdio>
#include <cstdlib>

#include "troupe/launch/commands.h"
#include "troupe/launch/config.h"
#include "troupe/launch/plan.h"
#include "troupe/launch/run.h"
#include "troupe/policy/io/chat_template.h"

namespace troupe::launch {
namespace {
// The config, its warnings printed; or nothing, its errors printed (the command exits 2).
std::optional<LoadedConfig> load_and_report(const std::string& file, const std::vector<std::string>& sets) {
  auto loaded = load_config(file, sets);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.error().message.c_str());
    return std::nullopt;
  }
  for (const auto& w : loaded->warnings) std::fprintf(stderr, "%s\n", w.c_str());
  return std::move(loaded).value();
}

// The experiment YAML and its --set overrides, as `run` and `validate` take them.
struct ConfigArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string device_memory;
};

void add_config_args(CLI::App* app, ConfigArgs& a) {
  app->add_option("config", a.config, "Experiment YAML")->required();
  app->add_option("--set", a.sets, "Override a key: --set grpo.max_steps=10 (repeatable)");
  app->add_option("--device-memory", a.device_memory,
                  "Refuse the config when a rank's memory plan (troupe plan) exceeds this, e.g. 80GiB");
}

// learner.memory_budget and --device-memory against the memory plan: 0, or 2 after the table and
// the message naming the rank that does not fit.
int check_budget(const LoadedConfig& loaded, const ConfigArgs& a) {
  std::optional<uint64_t> device_memory;
  if (!a.device_memory.empty()) {
    auto b = parse_byte_size(a.device_memory, "--device-memory");
    if (!b.ok()) return report_error(b.error());
    device_memory = *b;
  }
  return check_memory_budget(loaded.config, a.config, device_memory);
}
}  // namespace


Command add_run_command(CLI::App& root) {
  struct Opts : ConfigArgs {
    std::string resume;
    int restarts = 0;
    std::string launcher;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("run", "Run an experiment described by a YAML file (alone or under mpirun)");
  add_config_args(app, *o);
  app->add_option("--resume", o->resume, "Resume the run in this run directory from its latest checkpoint");
  auto* restarts_flag = app->add_option("--restarts", o->restarts,
                                        "Run the job under a supervisor that restarts it from its latest checkpoint when it "
                                        "fails, at most N times (overrides run.restarts)")
                            ->check(CLI::Range(0, 1000));
  auto* launcher_flag = app->add_option("--launcher", o->launcher,
                                        "With --restarts: the command that starts the job's ranks, e.g. \"mpirun -np 4\" or "
                                        "\"srun --mpi=pmix -n 4\" (default: one process; overrides run.launcher)");
  return {app, [o, restarts_flag, launcher_flag]() {
            auto loaded = load_and_report(o->config, o->sets);
            if (!loaded) return 2;
            if (int rc = check_budget(*loaded, *o); rc != 0) return rc;
            // the flags override run.restarts and run.launcher
            const int restarts = restarts_flag->count() > 0 ? o->restarts : loaded->config.run.restarts;
            const std::string launcher = launcher_flag->count() > 0 ? o->launcher : loaded->config.run.launcher;
            const char* from = restarts_flag->count() > 0 ? "--restarts" : "run.restarts";
            if (restarts > 0 && !std::getenv("TROUPE_SUPERVISED")) {
              if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK") ||
                  std::getenv("SLURM_STEP_NUM_TASKS")) {
                std::fprintf(stderr, "troupe run: %s %d: the supervisor runs outside mpirun/srun; start it "
                                     "as troupe run %s --restarts %d --launcher \"mpirun -np N\" (or set run.launcher), "
                                     "or pass --restarts 0 to run under mpirun/srun without it\n",
                             from, restarts, o->config.c_str(), restarts);
                return 2;
              }
              SupervisorOptions so{o->config, o->sets, o->resume.empty() ? loaded->config.run.dir : o->resume,
                                   !o->resume.empty(), restarts, launcher, loaded->config.run.restart_remaining_ranks,
                                   loaded->config.cluster};
              return supervise_run(so);
            }
            if (launcher_flag->count() > 0 && !std::getenv("TROUPE_SUPERVISED")) {
              std::fprintf(stderr, "troupe run: --launcher needs --restarts N > 0 (or run.restarts)\n");
              return 2;
            }
            return run_experiment(*loaded, RunOptions{o->resume});
          }};
}

// How each judge with a local model (judge.model, no url) is prompted: through the model's chat
// template (the rubric as one user turn, with the generation prompt) or as plain text after BOS.
static void print_local_judges(const actors::ExperimentConfig& cfg) {
  for (size_t i = 0; i < cfg.envs.size(); ++i) {
    const auto& c = cfg.envs[i].config;
    if (!c.is_object() || !c.contains("judge") || !c["judge"].is_object()) continue;
    const auto& j = c["judge"];
    if (!j.value("url", std::string()).empty() || !j.contains("model") || !j["model"].is_string()) continue;
    const std::string model = j["model"].get<std::string>();
    auto t = policy::io::load_chat_template_dir(model);
    const std::string how = !t.ok() ? "its chat template cannot be read: " + t.error().message
                            : *t    ? "the rubric goes through its chat template (one user turn, generation prompt)"
                                    : "no chat template: the rubric is the plain prompt after BOS";
    std::printf("envs[%zu].config.judge.model %s: %s\n", i, model.c_str(), how.c_str());
  }
}

Command add_validate_command(CLI::App& root) {
  struct Opts : ConfigArgs {
    bool print = false;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("validate", "Check an experiment YAML without running it");
  add_config_args(app, *o);
  app->add_flag("--print", o->print, "Print the resolved config (every key) on stdout");
  return {app, [o]() {
            auto loaded = load_and_report(o->config, o->sets);
            if (!loaded) return 2;
            if (int rc = check_budget(*loaded, *o); rc != 0) return rc;
            if (Status data = check_env_data(*loaded); !data.ok()) {
              std::fprintf(stderr, "%s: error: %s\n", o->config.c_str(), data.error().message.c_str());
              return 2;
            }
            if (o->print)
              std::fputs(resolved_yaml(loaded->config).c_str(), stdout);
            else
            {
              const auto& c = loaded->config.cluster;
              const int ranks = c.learners + c.generators + c.env_workers + c.scorers;
              if (c.learners > 1)  // one process hosts one learner: data parallelism needs ranks
                std::printf("%s: ok (needs mpirun -np %d or srun --mpi=pmix -n %d: learners %d, generators %d, env_workers %d)\n",
                            o->config.c_str(), ranks, ranks, c.learners, c.generators, c.env_workers);
              else
                std::printf("%s: ok (one process, or mpirun -np %d / srun --mpi=pmix -n %d)\n", o->config.c_str(), ranks, ranks);
              print_local_judges(loaded->config);
            }
            return 0;
          }};
}

Command add_eval_command(CLI::App& root) {
  struct Opts {
    std::string config, checkpoint, base;
    std::vector<std::string> sets;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("eval", "Held-out metrics of a checkpoint, as one JSON object");
  app->add_option("config", o->config, "Experiment YAML")->required();
  app->add_option("--checkpoint", o->checkpoint,
                  "Model directory (a checkpoint), or a LoRA checkpoint / PEFT adapter directory evaluated on the base "
                  "(--base, else policy.path, else its base.json's path)")
      ->required();
  app->add_option("--base", o->base, "The base model an adapter --checkpoint is evaluated on, instead of policy.path");
  app->add_option("--set", o->sets, "Override a key (e.g. eval.num_prompts=100)");
  return {app, [o]() {
            auto loaded = load_and_report(o->config, o->sets);
            if (!loaded) return 2;
            return eval_checkpoint(*loaded, o->checkpoint, o->base);
          }};
}

}  // namespace troupe::launch
