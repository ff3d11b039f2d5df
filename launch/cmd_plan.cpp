// `troupe plan CONFIG`: the memory plan of an experiment (every role and rank, by kind) as a table
// or JSON, and whether it fits a device size or learner.memory_budget; nothing is loaded or started.
// Exit 0 when it fits (or no size is given), 2 on bad input or when a rank does not fit.
#include <cstdio>
#include <memory>

#include "troupe/launch/commands.h"
#include "troupe/launch/config.h"
#include "troupe/launch/plan.h"

namespace troupe::launch {

Command add_plan_command(CLI::App& root) {
  struct Opts {
    std::string config, device_memory, shard;
    std::vector<std::string> sets;
    int learners = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* app = root.add_subcommand("plan", "Plan every rank's memory (weights, gradients, optimizer, activations, "
                                          "KV cache, buffers) from the config and the model's shape");
  app->add_option("config", o->config, "Experiment YAML")->required();
  app->add_option("--set", o->sets, "Override a key: --set rollout.prompts_per_step=64 (repeatable)");
  app->add_option("--device-memory", o->device_memory,
                  "Memory of each rank's device, e.g. 80GiB or 80GB (GPU memory on cuda, RAM per rank on cpu)");
  app->add_option("--learners", o->learners, "Learner ranks (default cluster.learners)")->check(CLI::Range(1, 1 << 20));
  app->add_option("--shard", o->shard, "Sharding of the learners: none, optimizer, gradients or parameters (ZeRO 1/2/3)");
  app->add_flag("--json", o->json, "Print the plan as one JSON object");
  return {app, [o]() {
            auto loaded = load_config(o->config, o->sets);
            if (!loaded.ok()) {
              std::fprintf(stderr, "%s\n", loaded.error().message.c_str());
              return 2;
            }
            PlanOptions opts;
            opts.learners = o->learners;
            if (!o->device_memory.empty()) {
              auto b = parse_byte_size(o->device_memory, "--device-memory");
              if (!b.ok()) return report_error(b.error());
              opts.device_memory = *b;
            }
            if (!o->shard.empty()) {
              opts.shard = enum_from_name<ShardStage>(o->shard);
              if (!opts.shard)
                return report_error(invalid_input("--shard: \"" + o->shard +
                                                  "\" is not a stage (none, optimizer, gradients, parameters)"));
            }
            auto plan = plan_memory(loaded->config, o->config, opts);
            if (!plan.ok()) return report_error(plan.error());
            if (o->json)
              std::printf("%s\n", plan_json(*plan).dump(2).c_str());
            else
              std::fputs(plan_table(*plan).c_str(), stdout);
            return plan_overflow(*plan) ? 2 : 0;
          }};
}

}  // namespace troupe::launch
