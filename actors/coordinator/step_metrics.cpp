// The metric rows of the step loop, one per SFT or GRPO step: rewards and accuracy per step and
// per env, lengths, staleness, the learners' losses, and the time breakdown (generation, env,
// learner, weight sync, idle).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "coordinator_internal.h"
#include "troupe/learner/advantages.h"

namespace troupe::actors::coord {

namespace {
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// data/epoch/<env>: the latest epoch of an env's rows this step drew from, for envs that say
// (the dataset env with shuffle: metadata.epoch); absent otherwise.
void add_data_epochs(json& row, const Rollout& r) {
  for (const auto& g : r.groups)
    if (g.metadata.is_object() && g.metadata.contains("epoch") && g.metadata["epoch"].is_number_integer()) {
      const std::string key = "data/epoch/" + g.env;
      row[key] = std::max(row.value(key, int64_t{0}), g.metadata["epoch"].get<int64_t>());
    }
}

// A judged env's (dataset with config.judge) completions: judge/parse_fail_frac, the share that
// still failed as judge_parse after retries, and judge/latency_s, the mean seconds of the judge
// calls that answered (from each verify's info); both absent in steps without a judged env.
void add_judge_metrics(const RunState& s, const Rollout& r, json& row) {
  int judged = 0, parse_fails = 0, timed = 0;
  double latency = 0;
  for (const auto& g : r.groups) {
    const auto& spec = env_spec(s, g.env);
    if (!spec.config.is_object() || !spec.config.contains("judge")) continue;
    judged += static_cast<int>(g.rewards.size());
    for (const auto& reason : g.reasons) parse_fails += reason == "judge_parse" ? 1 : 0;
    for (const auto& info : g.infos) {
      json j = json::parse(info, nullptr, false);
      if (j.is_object() && j.contains("judge_latency_s") && j["judge_latency_s"].is_number()) {
        latency += j["judge_latency_s"].get<double>();
        ++timed;
      }
    }
  }
  if (judged == 0) return;
  row["judge/parse_fail_frac"] = static_cast<double>(parse_fails) / judged;
  if (timed > 0) row["judge/latency_s"] = latency / timed;
}

// The reward models' raw scores (component reward_model, before envs[].config.center) of a step's
// scored completions, over every type: reward_model env: reward_model/score_mean and
// reward_model/score_std (population); both absent in steps without a scored completion.
void add_reward_model_metrics(const RunState& s, const Rollout& r, json& row) {
  std::vector<double> scores;
  for (const auto& g : r.groups) {
    if (env_spec(s, g.env).type != EnvType::reward_model) continue;
    for (size_t j = 0; j < g.components.size(); ++j) {
      if (j < g.errors.size() && !g.errors[j].empty()) continue;
      json c = g.components[j].empty() ? json() : json::parse(g.components[j], nullptr, false);
      if (c.is_object() && c.contains("reward_model") && c["reward_model"].is_number())
        scores.push_back(c["reward_model"].get<double>());
    }
  }
  if (scores.empty()) return;
  double mean = 0, var = 0;
  for (double x : scores) mean += x;
  mean /= static_cast<double>(scores.size());
  for (double x : scores) var += (x - mean) * (x - mean);
  row["reward_model/score_mean"] = mean;
  row["reward_model/score_std"] = std::sqrt(var / static_cast<double>(scores.size()));
}

// A scorer use's answered requests under `prefix`, all depending on timing: latency_s (mean seconds
// per request, its last try), latency_max_s, batch_requests (the mean number of requests that
// shared a scorer batch with one of them: continuous batching) and batch_requests_max.
void add_scorer_timings(json& row, const std::string& prefix, const ScorerStats& st) {
  const double n = st.requests > 0 ? static_cast<double>(st.requests) : 1.0;
  row[prefix + "latency_s"] = st.latency_s / n;
  row[prefix + "latency_max_s"] = st.latency_max_s;
  row[prefix + "batch_requests"] = static_cast<double>(st.batch_requests) / n;
  row[prefix + "batch_requests_max"] = st.batch_requests_max;
}

// The env workers' scorer requests of a step's verifies: a judge's local model (scorer/judge/*)
// and a reward model on the scorers (scorer/reward_model/*), each only in steps that made some.
void add_env_scorer_timings(const Rollout& r, json& row) {
  ScorerStats judge, reward_model;
  for (const auto& g : r.groups) {
    judge.add(g.judge_scorer);
    reward_model.add(g.reward_model_scorer);
  }
  if (judge.requests > 0) add_scorer_timings(row, "scorer/judge/", judge);
  if (reward_model.requests > 0) add_scorer_timings(row, "scorer/reward_model/", reward_model);
}
}  // namespace

json sft_step_row(const RunState& s, const json& learner_metrics, double tokens, int batch, double sync_s,
                  double step_s) {
  json row = {{"step", s.step},
              {"phase", "sft"},
              {"policy_version", s.version},
              {"reward_mean", nullptr},
              {"reward_std", nullptr},
              {"response_len_mean", tokens / batch},
              {"truncated_frac", 0.0},
              {"env_failures", 0},
              {"weight_sync_s", sync_s},
              {"step_s", step_s},
              {"tokens_per_s", step_s > 0 ? tokens / step_s : 0.0},
              {"wall_s", s.now_s()}};
  for (const char* key : {"loss", "kl", "clip_frac_low", "clip_frac_high", "entropy", "grad_norm", "lr"})
    row[key] = learner_metrics.value(key, 0.0);
  // training state held by the learner rank that answered (parameters + gradients + AdamW moments)
  if (learner_metrics.contains("state_bytes")) row["learner/state_bytes"] = learner_metrics["state_bytes"];
  return row;
}

json grpo_step_row(const RunState& s, const Rollout& r, const Prepared& p, const Trained& tr, int64_t step) {
  const int G = s.cfg.rollout.num_generations;
  std::vector<float> rewards;
  double resp_len = 0, truncated = 0, correct = 0;
  int env_failures = 0;
  std::map<std::string, std::pair<double, int>> per_env;
  for (const auto& g : r.groups) {
    for (int j = 0; j < G; ++j) {
      rewards.push_back(static_cast<float>(g.rewards[j]));
      resp_len += static_cast<double>(g.samples[j].tokens.size());
      truncated += g.samples[j].truncated ? 1 : 0;
      correct += g.correct[j];
      if (!g.errors[j].empty()) ++env_failures;
      auto& pe = per_env[g.env];
      pe.first += g.rewards[j];
      pe.second += 1;
    }
  }
  double n = static_cast<double>(rewards.size());
  auto rs = learner::stats_of(rewards);
  const int64_t lag = s.version - r.policy_version;
  json row = {{"step", step},
              {"phase", "grpo"},
              {"policy_version", r.policy_version},
              {"reward_mean", rs.mean},
              {"reward_std", rs.std},
              {"accuracy", correct / n},
              {"response_len_mean", resp_len / n},
              {"truncated_frac", truncated / n},
              {"env_failures", env_failures},
              {"stale_dropped", p.stale_dropped},
              {"staleness", lag},
              {"groups_generated", r.groups.size()},
              {"groups_kept", p.groups_kept},
              {"generation_rounds", r.rounds}};
  if (s.cfg.rollout.in_flight_updates) {
    // each completion token's lag behind the learners' version (tokens of every generated sample)
    double sum = 0, tokens = 0;
    int64_t worst = 0;
    for (const auto& g : r.groups)
      for (const auto& x : g.samples)
        for (size_t i = 0; i < x.versions.size(); ++i) {
          const auto [b, e] = version_span(x.version_starts, i, x.tokens.size());
          if (e <= b) continue;
          const int64_t l = s.version - x.versions[i];
          sum += static_cast<double>(l) * static_cast<double>(e - b);
          tokens += static_cast<double>(e - b);
          worst = std::max(worst, l);
        }
    row["token_staleness_mean"] = tokens > 0 ? sum / tokens : 0.0;
    row["token_staleness_max"] = worst;
  }
  for (auto& [name, v] : per_env) {
    row["reward_mean/" + name] = v.first / std::max(1, v.second);
    row["prompts/" + name] = v.second / std::max(1, G);  // groups sampled from this env (envs[].weight)
  }
  add_data_epochs(row, r);
  for (const char* key : {"loss", "pg_loss", "kl", "clip_frac_low", "clip_frac_high", "entropy", "grad_norm",
                          "lr", "is_weight_mean"})
    row[key] = tr.updated ? tr.metrics.value(key, 0.0) : 0.0;
  if (tr.updated && tr.metrics.contains("state_bytes")) row["learner/state_bytes"] = tr.metrics["state_bytes"];
  // sampler vs learner on the weights that sampled (present when some response token was compared)
  if (tr.updated)
    for (const char* key : {"logprob_diff_max", "logprob_diff_mean", "mismatch_kl", "mismatch_frac", "mismatch_tokens",
                            "routing_agreement"})
      if (tr.metrics.contains(key)) row[key] = tr.metrics[key];
  // distill: the learner's distillation terms, and the teacher requests of this step's scorers
  if (tr.updated)
    for (auto it = tr.metrics.begin(); it != tr.metrics.end(); ++it)
      if (it.key().rfind("distill/", 0) == 0) row[it.key()] = *it;
  if (s.cfg.distill.enabled()) {
    row["scorer/requests"] = p.scorer.requests;
    row["scorer/failures"] = p.scorer.failures;
    row["scorer/retries"] = p.scorer.retries;
    add_scorer_timings(row, "scorer/", p.scorer);
  }
  add_env_scorer_timings(r, row);
  // failed env calls, only when there were any: env_failures/<reason> (after retries), env_retries
  for (const auto& g : r.groups)
    for (size_t j = 0; j < g.errors.size(); ++j)
      if (!g.errors[j].empty()) {
        const std::string key = "env_failures/" + (j < g.reasons.size() && !g.reasons[j].empty() ? g.reasons[j] : "env_error");
        row[key] = row.value(key, 0) + 1;
      }
  if (r.retries > 0) row["env_retries"] = r.retries;
  // a NeMo Gym server's reward_components and a verifiers env's rewards (score x weight) and metrics:
  // reward_components/<env>/<name>; a reward hook's (dataset, verifier: python) named components:
  // reward/<name>, and so are a judged dataset env's (verifier, judge) and a reward_model env's
  // (reward_model: the model's raw score); each the mean over the completions that reported it
  std::map<std::string, std::pair<double, int>> parts;
  for (const auto& g : r.groups) {
    const auto& spec = env_spec(s, g.env);
    const bool dataset = (spec.type == EnvType::builtin && spec.env_id() == "dataset") || spec.type == EnvType::judge ||
                         spec.type == EnvType::reward_model;
    const bool reward_hook = spec.type == EnvType::reward_model ||
                             (dataset && spec.config.is_object() &&
                              (spec.config.value("verifier", "") == "python" || spec.config.contains("judge")));
    if (spec.type != EnvType::nemo_gym && spec.type != EnvType::verifiers && !reward_hook) continue;
    const std::string prefix = reward_hook ? "reward/" : "reward_components/" + g.env + "/";
    for (const auto& c : g.components) {
      json j = c.empty() ? json() : json::parse(c, nullptr, false);
      if (!j.is_object()) continue;
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it->is_number()) {
          auto& p = parts[prefix + it.key()];
          p.first += it->get<double>();
          p.second += 1;
        }
    }
  }
  for (const auto& [key, v] : parts) row[key] = v.first / v.second;
  add_judge_metrics(s, r, row);
  add_reward_model_metrics(s, r, row);
  return row;
}

void add_grpo_timings(const RunState& s, json& row, const Rollout& r, const Trained& tr, double sync_s,
                      double step_s, double gen_idle) {
  double resp_len = 0;
  for (const auto& g : r.groups)
    for (const auto& x : g.samples) resp_len += static_cast<double>(x.tokens.size());
  double idle = s.pipeline->generator_idle_s(r, gen_idle, step_s);
  if (s.cfg.rollout.in_flight_updates) row["version_wait_s"] = r.version_wait_s;
  row["gen_s"] = r.gen_s;
  row["env_s"] = r.env_s;
  row["learner_s"] = tr.learner_s;
  row["weight_sync_s"] = sync_s;
  row["idle_s"] = idle;  // generator idle: no sampling work during this step
  row["learner_idle_s"] =
      std::max(0.0, step_s - tr.learner_s - sync_s);  // learner neither training nor syncing
  row["step_s"] = step_s;
  row["tokens_per_s"] = step_s > 0 ? resp_len / step_s : 0.0;
  row["wall_s"] = s.now_s();
  row["process_cpu_s"] = process_cpu_s();  // CPU time of every thread of this process so far
}

}  // namespace troupe::actors::coord
