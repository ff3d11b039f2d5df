// The GRPO phase in async mode (rollout.async): two coroutines of the coordinator actor. The
// rollout one produces step k+1 while the training one trains step k. Step k's rollout is sampled
// with exactly one version, the learners' once step k - max_staleness - 1 was done (Pipeline), and
// without streaming at most max(1, max_staleness) rollouts wait in the queue. With
// rollout.async_chunks > 1 each step's groups come in parts and the learners start on a part as
// soon as it is scored (the queue then holds parts; the version condition alone bounds how far
// ahead the rollout runs). Before an eval or a checkpoint the pipeline is drained; a checkpoint
// keeps the finished rollouts it holds (pipeline_state.h), and a resume trains them.
#include <algorithm>
#include <deque>
#include <map>
#include <optional>

#include "coordinator_internal.h"
#include "pipeline_state.h"

namespace troupe::actors::coord {

using runtime::Reply;

namespace {

// The rollout coroutine runs ahead of the training one, in the same actor. Which version samples
// step k's rollout depends only on the seed and the config, never on timing: the version the
// learners had once step k - max_staleness - 1 was done (the phase's first version for the first
// steps), which every generation request of the rollout names.
struct Pipeline {
  std::deque<std::pair<int64_t, Result<Rollout>>> queue;  // (k, rollout or one streamed part)
  int64_t first_k = 0;         // the phase's first GRPO step (after a resume: the step it continues at)
  int64_t start_version = 0;   // the learners' version at first_k
  std::map<int64_t, int64_t> version_after;  // GRPO step k -> the learners' version once it is done
  int64_t produced = -1;       // the last step whose whole rollout is queued (or trained)
  int64_t last_k = 0;          // the last step the rollout coroutine produces
  bool stop = false;           // the training side is done: the rollout coroutine ends
  bool ended = false;          // the rollout coroutine has ended (done, stopped or failed)
  runtime::Wakeup changed;  // any of the above changed
};

struct Bounds {
  int64_t first_k = 0, K = 0;  // GRPO steps [first_k, K)
  StepCounter steps;           // global step of GRPO step k: steps.global_of_grpo(k)
  bool streamed = false;
};

// The version step k's rollout samples with; none while the learners have not got there yet.
std::optional<int64_t> version_for(const RunState& s, const Pipeline& pl, int64_t k) {
  const int64_t j = k - s.cfg.rollout.max_staleness - 1;
  if (j < pl.first_k) return pl.start_version;
  auto it = pl.version_after.find(j);
  if (it == pl.version_after.end()) return std::nullopt;
  return it->second;
}

bool may_start(const RunState& s, const Pipeline& pl, const Bounds& b, int64_t k) {
  const int staleness = s.cfg.rollout.max_staleness;
  return version_for(s, pl, k).has_value() &&
         (b.streamed || pl.queue.size() < static_cast<size_t>(std::max(1, staleness)));
}

void push(Pipeline& pl, int64_t k, Result<Rollout> r) {
  pl.queue.emplace_back(k, std::move(r));
  pl.changed.notify_all();
}

// The rollout coroutine: steps after pl.produced up to pl.last_k as the versions let it; a failed
// rollout is queued as the error and ends it.
Task<Status> roll_ahead(RunState& s, Pipeline& pl, Bounds b) {
  struct Ended {  // however the coroutine ends, the training side may stop waiting for it
    Pipeline& pl;
    ~Ended() {
      pl.ended = true;
      pl.changed.notify_all();
    }
  } ended{pl};
  for (int64_t k = pl.produced + 1; k <= pl.last_k; ++k) {
    double wait0 = mono_seconds();
    while (!pl.stop && !may_start(s, pl, b, k)) co_await pl.changed.wait();
    if (pl.stop) co_return Status{};
    const double waited = mono_seconds() - wait0;
    const int64_t version = *version_for(s, pl, k);
    if (b.streamed) {
      PartSink sink = [&pl, k, waited](Rollout&& part) {
        part.idle_s = part.part == 0 ? waited : 0.0;
        push(pl, k, std::move(part));
      };
      auto r = co_await make_round(s, b.steps.global_of_grpo(k), k, 0, &sink, version);
      if (!r.ok()) {
        push(pl, k, r.error());
        co_return Status{};
      }
    } else {
      auto r = co_await make_rollout(s, b.steps.global_of_grpo(k), k, version);
      if (r.ok()) r->idle_s = waited;
      const bool failed = !r.ok();
      push(pl, k, std::move(r));
      if (failed) co_return Status{};
    }
    pl.produced = k;
    pl.changed.notify_all();
  }
  co_return Status{};
}

// A resumed run: the rollouts its checkpoint kept go first into the queue. They were sampled with
// versions the learners no longer hold; without them (a checkpoint written after a failure, or by
// a run with another pipeline shape) those steps sample with the checkpoint's version instead.
Status restore_pipeline(RunState& s, Pipeline& pl, const Bounds& b) {
  const int staleness = s.cfg.rollout.max_staleness;
  const int chunks = b.streamed ? s.cfg.rollout.async_chunks : 1;
  auto log = [&](const std::string& m) { s.log(m); };
  std::string bytes = std::move(s.resumed_pipeline);
  s.resumed_pipeline.clear();
  if (bytes.empty()) {
    if (pl.first_k > 0 && staleness > 0)
      log("async resume: the checkpoint holds no finished rollouts; steps " + std::to_string(b.steps.global_of_grpo(pl.first_k)) +
          ".." + std::to_string(b.steps.global_of_grpo(pl.first_k + staleness - 1)) + " sample with version " +
          std::to_string(pl.start_version) + " (an uninterrupted run sampled them with older ones)");
    return {};
  }
  TROUPE_ASSIGN_OR_RETURN(auto p, decode_pipeline(bytes, "checkpoint " + std::string("pipeline.bin")));
  const int in_flight = s.cfg.rollout.in_flight_updates ? s.cfg.rollout.in_flight_every : 0;
  const int min_lag = s.cfg.rollout.in_flight_updates ? s.cfg.rollout.in_flight_min_lag : 0;
  if (p.max_staleness != staleness || p.async_chunks != chunks || p.in_flight_every != in_flight ||
      p.in_flight_min_lag != min_lag || p.trained_steps != pl.first_k) {
    log("async resume: the checkpoint's " + std::to_string(p.finished.size()) +
        " finished rollouts are not used (saved with max_staleness " + std::to_string(p.max_staleness) +
        ", async_chunks " + std::to_string(p.async_chunks) + ", in-flight every " + std::to_string(p.in_flight_every) +
        " after GRPO step " + std::to_string(p.trained_steps) + "; this run has " + std::to_string(staleness) + ", " +
        std::to_string(chunks) + ", " + std::to_string(in_flight) + ", " + std::to_string(pl.first_k) + ")");
    return {};
  }
  int64_t last = -1;
  for (auto& [k, r] : p.finished) {
    if (k < pl.first_k || k > pl.last_k) continue;
    last = std::max(last, k);
    pl.queue.emplace_back(k, std::move(r));
  }
  if (last >= 0) {
    pl.produced = last;
    log("async resume: the rollouts of steps " + std::to_string(b.steps.global_of_grpo(pl.first_k)) + ".." +
        std::to_string(b.steps.global_of_grpo(last)) + ", finished before the checkpoint, train first");
  }
  return {};
}

// The oldest queued (k, rollout), waiting for one; the rollout coroutine may go on (the queue shrank).
Task<std::pair<int64_t, Result<Rollout>>> pop(Pipeline& pl) {
  while (pl.queue.empty()) co_await pl.changed.wait();
  auto item = std::move(pl.queue.front());
  pl.queue.pop_front();
  pl.changed.notify_all();
  co_return item;
}

// Step k's parts arrive one by one; each goes to the learners at once (they accumulate its
// gradient while the next part is generated), the last one takes the optimizer step.
// learner_s: the learner's own compute time over the parts.
Task<Status> train_streamed(RunState& s, Pipeline& pl, int64_t step, int64_t k, double step_start) {
  Rollout whole;
  Prepared all;
  Trained t;
  std::vector<Reply<TrainRep>> reps;
  std::vector<size_t> rep_learner;
  bool sent = false;
  double gen_idle = 0;
  for (int c = 0, C = 1; c < C; ++c) {
    auto item = co_await pop(pl);
    if (!item.second.ok()) co_return item.second.error();
    Rollout& part = *item.second;
    if (item.first != k || part.part != c)
      co_return make_error(ErrorCode::internal, "coordinator: expected part " + std::to_string(c) +
                                                    " of GRPO step " + std::to_string(k) + ", got part " +
                                                    std::to_string(part.part) + " of step " +
                                                    std::to_string(item.first));
    C = part.parts;
    if (c == 0) {
      gen_idle = part.idle_s;
      whole = Rollout{};
      whole.policy_version = part.policy_version;
      whole.seed_base = part.seed_base;
      whole.index0 = part.index0;
    }
    TROUPE_CO_ASSIGN_OR_RETURN(auto p, prepare(s, part));
    TROUPE_CO_TRY(co_await score_teacher(s, p));
    const bool last = c + 1 == C;
    if (!p.samples.empty() || (last && sent)) {
      TrainReq req;
      req.phase = learner::Phase::grpo;
      req.step = k;
      req.samples = std::move(p.samples);
      req.more = !last;
      if (last) s.learner_dirty = true;  // the last part takes the optimizer step
      for (auto& r : send_train(s, std::move(req))) reps.push_back(std::move(r));
      for (size_t l = 0; l < s.peers.learners.size(); ++l) rep_learner.push_back(l);
      sent = true;
    }
    all.adv.insert(all.adv.end(), p.adv.begin(), p.adv.end());
    all.groups_kept += p.groups_kept;
    all.stale_dropped += p.stale_dropped;
    all.scorer.add(p.scorer);
    whole.policy_version = std::min(whole.policy_version, part.policy_version);
    whole.gen_s += part.gen_s;
    whole.env_s += part.env_s;
    for (auto& g : part.groups) whole.groups.push_back(std::move(g));
  }
  for (size_t i = 0; i < reps.size(); ++i) {
    TROUPE_CO_ASSIGN_OR_RETURN(auto rep, co_await reps[i]);
    if (rep_learner[i] != 0) continue;
    t.learner_s += rep.train_s;
    if (i + s.peers.learners.size() >= reps.size()) t.metrics = json::parse(rep.metrics_json, nullptr, false);
  }
  t.updated = sent;
  co_return co_await finish_grpo_step(s, whole, all, t, step, step_start, gen_idle);
}

// Whether the GRPO step j is a drain point whatever the timing: an eval or a checkpoint follows it
// by the config (eval.every, checkpointing.every, the phase's last step).
bool drains_after(const ExperimentConfig& cfg, int64_t j) {
  const int64_t K = cfg.grpo.max_steps;
  if (j + 1 >= K) return true;  // the phase's last step (and none after it is trained)
  const int64_t step = StepCounter::of(cfg).global_of_grpo(j);
  const bool eval = cfg.eval.every > 0 && step % cfg.eval.every == 0;
  const bool save = cfg.checkpointing.enabled && cfg.checkpointing.every > 0 && step % cfg.checkpointing.every == 0;
  return eval || save;
}

class AsyncPipeline final : public StepPipeline {
 public:
  Task<Status> run(RunState& s, int64_t first_k) override {
    Pipeline& pl = pl_;
    Bounds& b = b_;
    b.first_k = first_k;
    b.K = s.cfg.grpo.max_steps;
    b.steps = s.steps();
    b.streamed = s.cfg.rollout.async_chunks > 1;
    pl.first_k = first_k;
    pl.start_version = s.version;
    pl.produced = first_k - 1;
    // With checkpoints, the rollouts of the next max_staleness steps are produced too, so that the
    // last checkpoint keeps them and a run extended with --resume trains what an uninterrupted
    // longer run would have.
    pl.last_k = b.K - 1 + (s.cfg.checkpointing.enabled ? s.cfg.rollout.max_staleness : 0);
    TROUPE_CO_TRY(restore_pipeline(s, pl, b));
    Task<Status> ahead = roll_ahead(s, pl, b);
    ahead.start();
    Status result;
    for (int64_t k = first_k; k < b.K && result.ok(); ++k) {
      double t = mono_seconds();
      s.step = b.steps.global_of_grpo(k);
      if (b.streamed) {
        result = co_await train_streamed(s, pl, s.step, k, t);
      } else {
        auto item = co_await pop(pl);
        if (!item.second.ok())
          result = item.second.error();
        else if (item.first != k)
          result = make_error(ErrorCode::internal, "coordinator: expected the rollout of GRPO step " + std::to_string(k) +
                                                       ", got step " + std::to_string(item.first));
        else
          result = co_await train_on(s, *item.second, s.step, k, t, item.second->idle_s);
      }
      if (result.ok()) result = co_await finish_step(s, k);
    }
    // the rollout coroutine ends at its next wait, or when the round it is in is done (with in-flight
    // updates a generation waiting for a step that will not be trained goes on with what it has)
    pl.stop = true;
    pl.changed.notify_all();
    if (s.cfg.rollout.in_flight_updates) tell_generators(s, StepVersion{0, 0, true});
    (void)co_await ahead;
    co_return result;
  }

  void step_synced(RunState& s, int64_t k) override {
    pl_.version_after[k] = s.version;
    pl_.changed.notify_all();
    if (s.cfg.rollout.in_flight_updates)  // after its Weights, so a generator holds the version it names
      tell_generators(s, StepVersion{k, s.version, false});
  }

  Task<Status> drain(RunState& s, int64_t k) override {
    const int64_t target = drained_through(s, k);
    while (!pl_.ended && pl_.produced < target) co_await pl_.changed.wait();
    co_return Status{};
  }

  std::optional<PipelineState> snapshot(const RunState& s, int64_t k) const override {
    PipelineState p;
    p.max_staleness = s.cfg.rollout.max_staleness;
    p.async_chunks = s.cfg.rollout.async_chunks > 1 ? s.cfg.rollout.async_chunks : 1;
    p.in_flight_every = s.cfg.rollout.in_flight_updates ? s.cfg.rollout.in_flight_every : 0;
    p.in_flight_min_lag = s.cfg.rollout.in_flight_updates ? s.cfg.rollout.in_flight_min_lag : 0;
    p.trained_steps = k + 1;
    p.trained_episodes = s.trained_episodes;
    const int64_t through = std::min(pl_.produced, drained_through(s, k));
    for (const auto& [step, r] : pl_.queue)
      if (step > k && step <= through && r.ok()) p.finished.emplace_back(step, *r);
    return p;
  }

  void name_in_flight(const RunState& s, int64_t k, GenerateReq& req) const override {
    if (!s.cfg.rollout.in_flight_updates) return;
    req.in_flight_steps = in_flight_steps(s, k);
    req.in_flight_every = s.cfg.rollout.in_flight_every;
  }

  bool rollouts_may_lag() const override { return true; }

  // (in-flight updates: a generation waiting for a newer version is idle too)
  double generator_idle_s(const Rollout& r, double gen_idle, double) const override {
    return gen_idle + r.version_wait_s;
  }

 private:
  Pipeline pl_;
  Bounds b_;

  static void tell_generators(RunState& s, const StepVersion& v) {
    for (size_t g = 0; g < s.peers.generators.size(); ++g)
      if (s.generator_alive(g)) (void)s.here->send(s.peers.generators[g], v);
  }

  // The last step whose rollout drain(s, k) finishes: k + max_staleness (at most the last one
  // produced); with in-flight updates after a step that is no drain point (a stop for time or a
  // signal), k + 1: later rollouts wait for versions of steps that will not be trained.
  int64_t drained_through(const RunState& s, int64_t k) const {
    const int64_t last = pl_.last_k;
    if (s.cfg.rollout.in_flight_updates && !drains_after(s.cfg, k)) return std::min(last, k + 1);
    return std::min(last, k + s.cfg.rollout.max_staleness);
  }

  // rollout.in_flight_updates: the GRPO steps whose versions step k's rollout moves to before
  // decode steps N, 2N, ... (N = rollout.in_flight_every; GenerateReq::in_flight_steps): k - S + i - 1
  // for i = 1..S (S = max_staleness), none past k - rollout.in_flight_min_lag nor the first drain
  // point in [k - S, k - 1] (its drain waits for this rollout), -1 (stay) where the step comes
  // before the phase's first one.
  std::vector<int64_t> in_flight_steps(const RunState& s, int64_t k) const {
    const int64_t S = s.cfg.rollout.max_staleness;
    const int64_t first_k = pl_.first_k;
    int64_t cap = k - s.cfg.rollout.in_flight_min_lag;
    for (int64_t j = std::max<int64_t>(0, k - S); j <= cap; ++j)
      if (drains_after(s.cfg, j)) {
        cap = j;
        break;
      }
    std::vector<int64_t> steps;
    for (int64_t i = 1; i <= S; ++i) {
      const int64_t j = std::min(k - S - 1 + i, cap);
      steps.push_back(j < first_k ? -1 : j);
    }
    return steps;
  }
};

}  // namespace

std::unique_ptr<StepPipeline> make_async_pipeline() { return std::make_unique<AsyncPipeline>(); }

}  // namespace troupe::actors::coord
