// launch.plan_rss: one learner step in this process, its peak resident memory against what
// `troupe plan` says learner 0 holds. The model has random weights at policy.path's config.json
// shape (only that file is read); the batch has the config's shape (every prompt and completion at
// its longest). Invariant: planned (learner 0's row less its sync buffers) and measured differ by at
// most TOLERANCE (argv) of the measure.
// Usage: troupe_plan_rss_probe TOLERANCE CONFIG.yaml [--set KEY=VALUE]...; prints one JSON line.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/actors/roles.h"
#include "troupe/launch/config.h"
#include "troupe/launch/plan.h"
#include "troupe/learner/trainer.h"
#include "troupe/policy/io/model_dir.h"
#include "troupe/policy/model.h"

namespace {

// VmRSS or VmHWM of this process, in bytes.
long long status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  long long kb = -1;
  while (in >> key) {
    if (key == std::string(field) + ":") {
      in >> kb;
      break;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return kb * 1024;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "rss_probe: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace troupe;
  const long long idle = status_bytes("VmRSS");  // the process with troupe's libraries loaded, nothing else
  if (argc < 3) return fail("usage: troupe_plan_rss_probe TOLERANCE CONFIG.yaml [--set KEY=VALUE]...");
  const double tolerance = std::atof(argv[1]);
  std::vector<std::string> sets;
  for (int i = 3; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--set") sets.emplace_back(argv[i + 1]);
  auto loaded = launch::load_config(argv[2], sets);
  if (!loaded.ok()) return fail(loaded.error().message);
  const auto& cfg = loaded->config;
  auto plan = launch::plan_memory(cfg, argv[2], {});
  if (!plan.ok()) return fail(plan.error().message);
  const launch::PlanRow& row = plan->rows.at(0);

  std::ifstream in(cfg.policy.path + "/config.json");
  auto arch = policy::io::config_from_hf_json(nlohmann::json::parse(in), cfg.policy.path + "/config.json");
  if (!arch.ok()) return fail(arch.error().message);
  policy::ModelConfig mc = *arch;
  static_cast<policy::ExecutionOptions&>(mc) = cfg.policy;
  mc.lora = cfg.policy.lora;
  auto model = policy::Model::create(mc, static_cast<uint64_t>(cfg.run.seed));
  if (!model.ok()) return fail(model.error().message);
  learner::ModelAdapter adapter(*model);
  learner::LocalCommunicator comm;
  learner::Trainer trainer(adapter, actors::learner_config(cfg, learner::Phase::grpo), comm);

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(3, mc.vocab_size - 1);
  const auto& ro = cfg.rollout;
  std::vector<learner::Sample> batch(static_cast<size_t>(ro.prompts_per_step) * ro.num_generations);
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& s = batch[i];
    for (int t = 0; t < ro.max_prompt_length; ++t) s.prompt.push_back(token(rng));
    for (int t = 0; t < ro.max_response_length; ++t) s.completion.push_back(token(rng));
    s.advantage = i % 2 ? 1.0f : -1.0f;
    s.reward = s.advantage;
  }
  // One step allocates everything a learner holds (AdamW's moments exist from the trainer's start).
  auto m = trainer.train_step(batch);
  if (!m.ok()) return fail(m.error().message);
  const long long peak = status_bytes("VmHWM");
  const long long measured = peak - idle;
  // A learner step's memory: the row without learner 0's weight-sync buffers (the encoder's copy of
  // what the generators hold and a payload), which no step allocates and this probe never makes.
  const double planned = static_cast<double>(row.device + row.host - row.sync);
  const double error = (planned - static_cast<double>(measured)) / static_cast<double>(measured);
  nlohmann::json out = {{"idle_rss_bytes", idle},       {"peak_rss_bytes", peak},     {"measured_bytes", measured},
                        {"planned_bytes", planned},     {"relative_error", error},    {"weights", row.weights},
                        {"gradients", row.gradients},   {"optimizer", row.optimizer}, {"activations", row.activations},
                        {"sync", row.sync},             {"other", row.other},         {"tokens", plan->train_tokens}};
  std::printf("%s\n", out.dump().c_str());
  if (std::fabs(error) > tolerance)
    return fail("planned " + launch::format_bytes(static_cast<uint64_t>(planned)) + " vs measured " +
                launch::format_bytes(static_cast<uint64_t>(measured)) + ": off by more than " +
                std::to_string(tolerance * 100) + "%");
  return 0;
}
