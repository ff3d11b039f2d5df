// `troupe bench scale`: the coordinator's cost per GRPO step for 1 to 1,000 generators and 1 to 256
// learners, measured by running the real coordinator against simulated roles on the deterministic
// scheduler (scale_sim.h; docs/scale.md). One row per (generators, learners): metric
// coordinator_ms_per_step (the coordinator's CPU time per step, the median over the repetitions)
// against the budget of 1 ms per started hundred generators; simulated steps/s and the staleness
// of the trained samples as extra fields.
#include <cmath>
#include <cstdio>

#include "troupe/bench/bench.h"
#include "troupe/bench/scale_sim.h"

namespace troupe::bench {

namespace {

constexpr int kGenerators[] = {1, 10, 100, 1000};
constexpr int kLearners[] = {1, 4, 16, 64, 256};

}  // namespace

int run_scale_suite(const BenchOptions& opt) {
  const int reps = std::max(5, opt.reps);
  for (int generators : kGenerators) {
    for (int learners : kLearners) {
      char name_buf[32];
      std::snprintf(name_buf, sizeof name_buf, "g%d_l%d", generators, learners);
      const std::string name = name_buf;
      if (!opt.wants(name)) continue;
      ScaleSimConfig c;
      c.generators = generators;
      c.learners = learners;
      c.steps = opt.quick ? 4 : 6;
      c.async = true;
      c.max_staleness = 1;
      std::vector<double> ms;
      ScaleSimReport last;
      for (int r = 0; r < reps; ++r) {
        auto rep = run_scale_sim(c);
        if (!rep.ok()) {
          std::fprintf(stderr, "troupe bench scale: %s: %s\n", name.c_str(), rep.error().message.c_str());
          return 1;
        }
        ms.push_back(rep->coordinator_ms_per_step);
        last = std::move(rep).value();  // the simulation itself is the same every repetition
      }
      const double budget_ms = std::ceil(generators / 100.0);
      nlohmann::json staleness = nlohmann::json::object();
      double lag_sum = 0, samples = 0;
      for (auto [lag, n] : last.staleness) {
        staleness[std::to_string(lag)] = n;
        lag_sum += static_cast<double>(lag * n);
        samples += static_cast<double>(n);
      }
      nlohmann::json extra = {
          {"generators", generators},
          {"learners", learners},
          {"prompts_per_step", generators * c.groups_per_generator},
          {"samples_per_step", generators * c.groups_per_generator * c.num_generations},
          {"steps", last.steps},
          {"reps", reps},
          {"steps_per_s", last.steps_per_s},
          {"samples_per_s", last.steps_per_s * generators * c.groups_per_generator * c.num_generations},
          {"sim_step_s", last.steps_per_s > 0 ? 1.0 / last.steps_per_s : 0.0},
          {"staleness", staleness},
          {"staleness_mean", samples > 0 ? lag_sum / samples : 0.0},
          {"roles_ms_per_step", 1e3 * last.roles_s / std::max(1, last.steps)},
          {"replies_per_step", static_cast<double>(last.messages) / std::max(1, last.steps)},
          {"mode", "async, max_staleness 1"},
      };
      emit(make_row("scale", name, Metric{"coordinator_ms_per_step", "ms", Better::lower},
                    Paired{median(ms), budget_ms}, "budget", std::move(extra)));
    }
  }
  return 0;
}

}  // namespace troupe::bench
