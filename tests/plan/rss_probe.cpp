// launch.plan_rss: one learner step in this process, its peak resident memory against what
// `troupe plan` says learner 0 holds. The model has random weights at policy.path's config.json
// shape (only that file is read); the batch has the config's shape (every prompt and completion at
// its longest). Invariant: planned (learner 0's row less its sync buffers) and measured differ by at
// most TOLERANCE (argv) of the measure.
// Under mpirun (cluster.learners ranks, learner.shard) each rank trains as that learner and compares
// its own row; --rest shard keeps learner.shard parameters' weights sharded on rank 0 too (troupe run
// keeps them whole there for the weight sync), which rank 0 then compares with learner 1's row.
// Usage: troupe_plan_rss_probe TOLERANCE CONFIG.yaml [--set KEY=VALUE]... [--rest shard]; prints
// one JSON line per rank.
#include <mpi.h>

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
#include "troupe/learner/communicator.h"
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

int probe(int argc, char** argv, long long idle, troupe::learner::Communicator& comm);

int main(int argc, char** argv) {
  const long long idle = status_bytes("VmRSS");  // the process with troupe's libraries loaded, nothing else
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMI_SIZE")) {
    troupe::learner::LocalCommunicator comm;
    return probe(argc, argv, idle, comm);
  }
  MPI_Init(&argc, &argv);
  int rc = 1;
  {
    auto comm = troupe::learner::make_mpi_communicator();
    rc = comm.ok() ? probe(argc, argv, idle, **comm) : fail(comm.error().message);
  }
  if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc);
  MPI_Finalize();
  return rc;
}

int probe(int argc, char** argv, long long idle, troupe::learner::Communicator& comm) {
  using namespace troupe;
  if (argc < 3) return fail("usage: troupe_plan_rss_probe TOLERANCE CONFIG.yaml [--set KEY=VALUE]... [--rest shard]");
  const double tolerance = std::atof(argv[1]);
  std::vector<std::string> sets;
  bool rest_shard = false;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--set") sets.emplace_back(argv[i + 1]);
    if (std::string(argv[i]) == "--rest") rest_shard = std::string(argv[i + 1]) == "shard";
  }
  auto loaded = launch::load_config(argv[2], sets);
  if (!loaded.ok()) return fail(loaded.error().message);
  const auto& cfg = loaded->config;
  launch::PlanOptions po;
  po.learners = comm.size();
  auto plan = launch::plan_memory(cfg, argv[2], po);
  if (!plan.ok()) return fail(plan.error().message);
  const int as = rest_shard && comm.size() > 1 && comm.rank() == 0 ? 1 : comm.rank();
  const launch::PlanRow& row = plan->rows.at(static_cast<size_t>(as));

  std::ifstream in(cfg.policy.path + "/config.json");
  auto arch = policy::io::config_from_hf_json(nlohmann::json::parse(in), cfg.policy.path + "/config.json");
  if (!arch.ok()) return fail(arch.error().message);
  policy::ModelConfig mc = *arch;
  static_cast<policy::ExecutionOptions&>(mc) = cfg.policy;
  mc.lora = cfg.policy.lora;
  auto model = policy::Model::create(mc, static_cast<uint64_t>(cfg.run.seed));
  if (!model.ok()) return fail(model.error().message);
  learner::ModelAdapter adapter(*model);
  learner::Trainer trainer(adapter, actors::learner_config(cfg, learner::Phase::grpo), comm);
  trainer.set_params_between_steps(rest_shard ? learner::ParamsAtRest::shard : learner::ParamsAtRest::rank0);

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
  nlohmann::json out = {{"rank", comm.rank()}, {"planned_row", as}, {"state_bytes", trainer.state_bytes()},
                        {"idle_rss_bytes", idle},       {"peak_rss_bytes", peak},     {"measured_bytes", measured},
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
