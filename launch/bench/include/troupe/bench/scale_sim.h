// The step loop at scale, simulated: the real Coordinator actor runs its GRPO phase against
// simulated env workers, generators and learners on the runtime's deterministic scheduler
// (threads = 0, manual clock). The simulated roles answer the coordinator's real messages
// (EnvResetReq, GenerateReq, EnvVerifyReq, TrainReq, GetWeightsReq, Weights) with the sizes a
// real role would send, after a delay from a timing model (per generated token, per trained
// token, env latency drawn from a log-normal, message latency, the weight broadcast over learner
// 0's link) instead of running a model. Nothing sleeps: the manual clock jumps to the next reply.
// What it measures: the coordinator's own CPU time per step (everything runs on the caller's
// thread: its CPU time times the share of its wall time outside the simulated roles' handlers, so
// the runtime's delivery of the coordinator's messages counts as the coordinator's), simulated
// steps/s and the staleness of what each step trains.
// `troupe bench scale` prints it for 1 to 1,000 generators and 1 to 256 learners (docs/scale.md).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::bench {

// What the simulated roles cost, in simulated seconds. Defaults: a small GPU job (one
// generator's batch advances one token per decode step; learners share the trained tokens).
struct SimTiming {
  double prefill_s = 0.02;         // a generation request's prompt pass
  double decode_step_s = 0.02;     // one decode step of a generator's whole batch
  double train_token_s = 2e-5;     // one trained token on one learner (the batch is split over the learners)
  double allreduce_s = 0.002;      // per optimizer step and per doubling of the learner count
  double env_median_s = 0.05;      // env reset / verify latency: log-normal with this median ...
  double env_sigma = 0.5;          // ... and this sigma (of the log)
  double message_s = 1e-4;         // one message, one way
  double weights_bytes = 2.7e8;    // a full weight sync to one generator (135M parameters in bf16)
  double delta_bytes = 8.2e6;      // a delta sync (weight_sync.mode delta: measured 33x fewer bytes in bf16)
  double link_bytes_per_s = 1.25e9;  // learner 0's link: syncs to the generators go one after another
  double weights_apply_s = 0.01;   // a generator decodes and checks a sync
};

struct ScaleSimConfig {
  int generators = 1;
  int learners = 1;
  int env_workers = 0;             // 0 = one per generator
  int groups_per_generator = 1;    // prompts per step = generators x this
  int num_generations = 4;         // G, samples per prompt
  int prompt_tokens = 32;
  int min_response_tokens = 8;     // completion lengths are uniform in [min, max]
  int max_response_tokens = 64;
  int steps = 5;                   // GRPO steps
  bool async = true;
  int max_staleness = 1;
  int relay_fanout = 4;            // weight_sync.relay_fanout (0 = every generator from learner 0's link)
  std::uint64_t seed = 1;
  SimTiming timing;
};

struct ScaleSimReport {
  int steps = 0;                       // GRPO steps the coordinator finished
  double sim_s = 0;                    // simulated seconds from the first to the last step's row
  double steps_per_s = 0;              // simulated, over the steps after the first
  double coordinator_s = 0;            // over the steps after the first
  double coordinator_ms_per_step = 0;  // coordinator_s / (steps - 1)
  double roles_s = 0;                  // wall time in the simulated roles' handlers, all steps
  std::int64_t messages = 0;           // requests the simulated roles answered
  std::map<std::int64_t, std::int64_t> staleness;  // learner version - sampling version -> trained samples
  std::vector<double> step_sim_s;      // simulated duration of each step (row to row; the first from the start)
};

// Runs the GRPO phase of `cfg.steps` steps (no SFT, no checkpoints, one held-out evaluation
// prompt at the end as every phase ends) and reports. Errors: a stalled simulation (the
// coordinator waits for something no simulated role will send), or the coordinator's error.
Result<ScaleSimReport> run_scale_sim(const ScaleSimConfig& cfg);

}  // namespace troupe::bench
