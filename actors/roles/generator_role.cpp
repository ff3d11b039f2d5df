// The rollout generator (prompt formatting, KV-cache sampling, stop strings, truncation) and the
// actor that hosts it, optionally on a compute thread of its own at a lower OS priority.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "in_flight_versions.h"
#include "role_support.h"
#include "troupe/actors/weight_relay.h"
#include "troupe/actors/roles.h"
#include "troupe/actors/weight_pieces.h"
#include "troupe/actors/weight_shards.h"

namespace troupe::actors {

namespace {
// faults.generator_token_s: a generation that takes `token_s` longer per token it sampled, as on a
// generator slower than this machine's cores (benchmarks that add generators; it sleeps, so the
// cores stay free for the other roles).
void wait_token_time(const GenerateRep& rep, double token_s) {
  if (token_s <= 0) return;
  size_t tokens = 0;
  for (const auto& s : rep.samples) tokens += s.tokens.size();
  std::this_thread::sleep_for(std::chrono::duration<double>(token_s * static_cast<double>(tokens)));
}
}  // namespace

Result<std::unique_ptr<Generator>> Generator::create(const ExperimentConfig& cfg) {
  auto g = std::make_unique<Generator>();
  g->cfg_ = cfg;
  g->dtype_ = cfg.weight_sync.dtype;
  TROUPE_ASSIGN_OR_RETURN(g->policy_, make_policy(cfg));
  round_to_dtype(g->policy_.model->params(), g->dtype_);  // version 0 as learner 0 would send it
  g->sync_table_ = sync_tensor_table(cfg, g->policy_.model->tensors(), g->policy_.model->params().size());
  const auto& tok = *g->policy_.tokenizer;
  if (tok.eos_id() >= 0) g->stop_tokens_.push_back(tok.eos_id());
  for (const auto& s : cfg.rollout.stop) {
    auto ids = tok.encode(s);
    if (ids.ok() && ids->size() == 1)
      g->stop_tokens_.push_back((*ids)[0]);  // stops inside the sampler
    else
      g->stop_strings_.push_back(s);  // cut after decoding
  }
  if (cfg.rollout.async && cfg.rollout.in_flight_updates) {  // Weights decode on a copy of their own
    TROUPE_ASSIGN_OR_RETURN(g->staging_, make_policy(cfg));
    round_to_dtype(g->staging_.model->params(), g->dtype_);
    g->in_flight_ = std::make_shared<InFlightVersions>();
  }
  if (!cfg.rollout.serve.empty()) {  // the endpoint samples from a copy of its own, on its own thread
    TROUPE_ASSIGN_OR_RETURN(auto copy, make_policy(cfg));
    round_to_dtype(copy.model->params(), g->dtype_);
    ServeEngineOptions eo;
    eo.slots = cfg.rollout.serve_slots;
    eo.context = std::min(copy.model->config().max_position_embeddings, 4096);
    eo.threads = role_threads(cfg.cluster, "generator", 0);
    g->serve_tok_ = std::shared_ptr<const policy::io::Tokenizer>(std::move(copy.tokenizer));
    g->serve_tmpl_ = copy.chat_template;
    TROUPE_ASSIGN_OR_RETURN(auto engine, ServeEngine::create(std::move(copy.model), eo));
    g->engine_ = std::move(engine);
  }
  return g;
}

Status Generator::set_weights(const Weights& w) {
  return apply_weights_to(*policy_.model, version_, w, engine_ && !holding_, probe_failure_);
}

Status Generator::apply_weights_to(policy::Model& model, int64_t& held, const Weights& w, bool to_engine,
                                   std::string& probe_failure) {
  ack_ = Ack{};
  ack_.value = held;
  ack_.version = w.version;
  // Not applied: the Ack says why, the error says it loudly; the weights and version held stay.
  auto not_applied = [&](WeightsStatus st, const std::string& why) -> Status {
    ack_.status = static_cast<std::int32_t>(st);
    ack_.detail = why;
    std::string msg = "generator: weights of version " + std::to_string(w.version) + " " + weights_status_name(st) +
                      ": " + why +
                      (st == WeightsStatus::probe_mismatch ? " (it holds them and will not sample until a sync passes)"
                                                           : " (it keeps version " + std::to_string(held) + ")");
    std::fprintf(stderr, "troupe: %s\n", msg.c_str());
    return make_error(ErrorCode::invalid_input, std::move(msg));
  };
  const auto encoding = static_cast<WeightEncoding>(w.encoding);
  auto params = model.params();
  if (encoding == WeightEncoding::device) {
    // The values come by the weight group's broadcast; every member takes each one, whatever it
    // then makes of it, so the group stays in step with learner 0.
    if (!weight_group_)
      return not_applied(WeightsStatus::refused, "the weights come by broadcast, but this generator is in no weight group");
    if (w.elements != params.size())  // (the sender's count: no broadcast of another size is taken)
      return not_applied(WeightsStatus::refused, std::to_string(w.elements) + " values by broadcast for a model of " +
                                                     std::to_string(params.size()) +
                                                     "; the weight group is out of step from here on");
    if (w.dtype != static_cast<std::int32_t>(WeightDtype::fp32) && w.dtype != static_cast<std::int32_t>(WeightDtype::bf16))
      return not_applied(WeightsStatus::refused, "values by broadcast in an unknown dtype (" + std::to_string(w.dtype) +
                                                     "); the weight group is out of step from here on");
    std::vector<float> received(params.size());  // (in the sender's dtype: the broadcast's size depends on it)
    if (Status st = weight_group_->receive(received, static_cast<WeightDtype>(w.dtype)); !st.ok())
      return not_applied(WeightsStatus::refused, st.error().message);
    if (w.dtype != static_cast<std::int32_t>(dtype_))
      return not_applied(WeightsStatus::refused, std::string("values in ") +
                                                     enum_string(static_cast<WeightDtype>(w.dtype)) +
                                                     ", but this generator holds " + enum_string(dtype_));
    const auto& tensors = model.tensors();
    const auto sums = weight_checksums(received, tensors, dtype_);
    for (size_t t = 0; t < sums.size(); ++t)
      if (t >= w.checksums.size() || sums[t] != w.checksums[t])
        return not_applied(WeightsStatus::checksum_failed,
                           "tensor " + tensors[t].name + " fails its checksum after version " +
                               std::to_string(w.version) + " came by broadcast");
    std::copy(received.begin(), received.end(), params.begin());
  } else if (encoding == WeightEncoding::raw) {
    if (w.params.size() != params.size())
      return not_applied(WeightsStatus::refused, std::to_string(w.params.size()) + " values for a model of " +
                                                     std::to_string(params.size()));
    std::vector<float> p = w.params;
    round_to_dtype(p, dtype_);
    TROUPE_TRY(model.set_params(p));
  } else {
    if (encoding == WeightEncoding::delta && w.base_version != held)
      return not_applied(WeightsStatus::refused, "a delta against version " + std::to_string(w.base_version) +
                                                     ", but this generator holds version " + std::to_string(held));
    // (a delta streamed in as its parts came: the rest applied and every checksum checked now)
    StreamedDelta* streamed = &model == policy_.model.get() ? std::exchange(finishing_, nullptr) : nullptr;
    WeightsApplied r = streamed ? streamed->finish(w) : apply_weights(w, params, sync_table_, dtype_);
    if (r.status != WeightsStatus::applied) return not_applied(r.status, r.detail);
  }
  if (to_engine) TROUPE_TRY(engine_->set_weights(w.version, std::vector<float>(params.begin(), params.end())));
  held = w.version;
  ack_.value = held;
  probe_failure.clear();
  if (!w.probe_tokens.empty()) {
    TROUPE_ASSIGN_OR_RETURN(auto mine, probe_logprobs(model, w.probe_tokens));
    const std::int64_t at = first_bit_difference(mine, w.probe_logprobs);
    if (at >= 0) {
      auto value = [](const std::vector<float>& v, std::int64_t i) {
        return i < static_cast<std::int64_t>(v.size()) ? std::to_string(v[static_cast<size_t>(i)]) : std::string("none");
      };
      char bits[64] = "";
      if (at < static_cast<std::int64_t>(std::min(mine.size(), w.probe_logprobs.size()))) {
        uint32_t a = 0, b = 0;
        std::memcpy(&a, &mine[static_cast<size_t>(at)], 4);
        std::memcpy(&b, &w.probe_logprobs[static_cast<size_t>(at)], 4);
        std::snprintf(bits, sizeof bits, " (bits 0x%08x vs 0x%08x)", a, b);
      }
      ack_.probe_position = at;
      probe_failure = "the probe log-prob at position " + std::to_string(at) + " is " + value(mine, at) +
                       " here, learner 0 computed " + value(w.probe_logprobs, at) + bits + " with the same " +
                       enum_string(dtype_) + " weights";
      return not_applied(WeightsStatus::probe_mismatch, probe_failure);
    }
  }
  return {};
}

Status Generator::join_weight_group(const WeightGroupReq& r) {
  TROUPE_ASSIGN_OR_RETURN(weight_group_, WeightGroup::join(policy_.model->backend(), r.id, r.nranks, r.rank));
  return {};
}

Status Generator::hold_weights(const Weights& w) {
  // Decoded (a delta against the newest version received) and checked now, so the Ack tells the
  // sender at once; the model goes back to the version it samples with until use_version.
  auto live = policy_.model->params();
  const std::vector<float> sampling(live.begin(), live.end());
  const int64_t sampling_version = version_;
  if (!held_.empty()) {
    TROUPE_TRY(policy_.model->set_params(held_.back().params));
    version_ = held_.back().version;
  }
  holding_ = true;
  Status st = set_weights(w);
  holding_ = false;
  if (st.ok()) {
    auto p = policy_.model->params();
    held_.push_back({version_, std::vector<float>(p.begin(), p.end())});
  }
  TROUPE_TRY(policy_.model->set_params(sampling));
  version_ = sampling_version;
  return st;
}

Status Generator::receive_weights(const Weights& w) {
  if (in_flight_) return stage_weights(w);
  return cfg_.rollout.async ? hold_weights(w) : set_weights(w);
}

bool Generator::stream_weights_begin(const Weights& head) {
  if (in_flight_ || cfg_.rollout.async || static_cast<WeightEncoding>(head.encoding) != WeightEncoding::delta ||
      head.base_version != version_)
    return false;
  auto s = std::make_unique<StreamedDelta>(head, policy_.model->params(), sync_table_, dtype_);
  if (!s->started()) return false;
  streamed_ = std::move(s);
  return true;
}

void Generator::stream_weights_feed(const char* payload, std::size_t size) {
  if (streamed_) streamed_->feed(payload, size);
}

void Generator::stream_weights_abort(const char* payload) {
  if (streamed_) streamed_->abort(payload);
  streamed_.reset();
}

Status Generator::stream_weights_end(const Weights& w) {
  if (!streamed_) return receive_weights(w);
  std::unique_ptr<StreamedDelta> s = std::move(streamed_);
  finishing_ = s.get();
  Status st = set_weights(w);  // (sync mode: what receive_weights does)
  if (finishing_) s->abort(w.payload.data());  // refused before the decoding: what was fed is undone
  finishing_ = nullptr;
  return st;
}

Status Generator::stage_weights(const Weights& w) {
  // Decoded against the newest version received (the staging model holds it) and checked now, so
  // the Ack tells the sender at once; kept by version until a generation moves to it. A probe
  // failure keeps the version out (a generation that needs it fails, naming it).
  std::string probe_failure;
  TROUPE_TRY(apply_weights_to(*staging_.model, staging_version_, w, false, probe_failure));
  auto p = staging_.model->params();
  in_flight_->add(staging_version_, std::vector<float>(p.begin(), p.end()));
  return {};
}

Status Generator::take_version(int64_t version) {
  if (version < 0) version = in_flight_->newest(version_);
  if (version == version_ && live_synced_) return {};
  std::vector<float> p;
  if (Status st = in_flight_->copy(version, p); !st.ok()) {
    if (version == version_) return {};  // nothing received yet: its own weights are that version
    return st;
  }
  TROUPE_TRY(policy_.model->set_params(p));  // (the first sync's weights too, as the others take them)
  version_ = version;
  live_synced_ = true;
  return {};
}

void Generator::step_done(const StepVersion& s) {
  if (!in_flight_) return;
  if (s.release)
    in_flight_->release();
  else
    in_flight_->step_done(s.grpo_step, s.version);
}

Status Generator::use_version(int64_t version) {
  while (!held_.empty() && (version < 0 || held_.front().version <= version)) {
    HeldWeights h = std::move(held_.front());
    held_.pop_front();
    TROUPE_TRY(policy_.model->set_params(h.params));
    if (engine_) TROUPE_TRY(engine_->set_weights(h.version, std::move(h.params)));
    version_ = h.version;
  }
  if (version >= 0 && version_ != version)
    return make_error(ErrorCode::internal, "generator: asked to sample with policy version " + std::to_string(version) +
                                               " but it holds version " + std::to_string(version_) +
                                               (held_.empty() ? std::string() : " and newer ones from " +
                                                                                    std::to_string(held_.front().version)));
  return {};
}

Result<GenerateRep> Generator::generate(const GenerateReq& r) {
  if (!probe_failure_.empty())
    return make_error(ErrorCode::internal, "generator: will not sample with version " + std::to_string(version_) +
                                               ", which failed the weight-sync probe check: " + probe_failure_);
  auto t0 = MonoClock::now();
  if (in_flight_) {
    TROUPE_TRY(take_version(r.policy_version));
    if (r.policy_version >= 0) in_flight_->drop_before(r.policy_version);  // later requests name newer ones
  } else {
    TROUPE_TRY(use_version(r.policy_version));
  }
  const auto& tok = *policy_.tokenizer;
  GenerateRep rep;
  rep.policy_version = version_;
  std::vector<std::vector<int32_t>> prompts;
  const bool by_tokens = !r.prompt_tokens.empty();
  const size_t n = by_tokens ? r.prompt_tokens.size() : r.prompts.size();
  rep.samples.resize(n);
  if (n == 0) return rep;  // (only taking the weights)
  for (size_t i = 0; i < n; ++i) {
    std::vector<int32_t> p;
    if (by_tokens) {
      p = r.prompt_tokens[i];
    } else {
      auto ids = encode_prompt(cfg_.rollout, tok, policy_.chat_template.get(), r.prompts[i],
                               i < r.prompt_messages.size() ? r.prompt_messages[i] : std::string());
      if (!ids.ok()) return invalid_input("prompt " + std::to_string(i) + ": " + ids.error().message);
      p = std::move(ids).value();
    }
    auto max_len = static_cast<size_t>(cfg_.rollout.max_prompt_length);
    if (p.size() > max_len) {
      p.erase(p.begin(), p.end() - static_cast<std::ptrdiff_t>(max_len));
      rep.samples[i].prompt_cut = true;
    }
    prompts.push_back(p);
  }
  policy::SamplingParams sp;
  sp.temperature = r.sampling.temperature;
  sp.top_k = r.sampling.top_k;
  sp.top_p = r.sampling.top_p;
  sp.max_new_tokens = r.sampling.max_new_tokens;
  sp.stop_tokens = stop_tokens_;
  sp.seed = r.sampling.seed;
  sp.streams = r.sampling.streams;
  // In-flight updates: before decode step i * every the weights move to the version after GRPO
  // step in_flight_steps[i-1] (waited for: the switch points never depend on timing).
  std::vector<std::pair<uint32_t, int64_t>> switches = {{0, version_}};  // (first token, version)
  if (in_flight_ && r.in_flight_every > 0 && !r.in_flight_steps.empty()) {
    sp.before_decode_step = [&](int t) -> Status {
      if (t % r.in_flight_every != 0) return {};
      const size_t i = static_cast<size_t>(t / r.in_flight_every);
      if (i == 0 || i > r.in_flight_steps.size() || r.in_flight_steps[i - 1] < 0) return {};  // -1: stay
      const auto w0 = MonoClock::now();
      std::optional<int64_t> v = in_flight_->wait_step(r.in_flight_steps[i - 1]);
      rep.version_wait_s += seconds_since(w0);
      if (!v || *v == version_) return {};  // released: no newer version will come
      TROUPE_TRY(take_version(*v));
      switches.emplace_back(static_cast<uint32_t>(t), version_);
      return {};
    };
  }
  TROUPE_ASSIGN_OR_RETURN(auto gens, policy_.model->generate(prompts, sp));
  for (size_t i = 0; i < gens.size(); ++i) {
    auto& s = rep.samples[i];
    s.prompt_tokens = std::move(prompts[i]);
    s.tokens = std::move(gens[i].tokens);
    s.logprobs = std::move(gens[i].logprobs);
    s.experts = std::move(gens[i].experts);
    const size_t route_width = s.tokens.empty() ? 0 : s.experts.size() / s.tokens.size();
    bool stopped = gens[i].stopped;
    auto text = tok.decode(s.tokens, true);
    s.text = text.ok() ? *text : std::string();
    if (!stop_strings_.empty()) {
      size_t cut = std::string::npos;
      for (const auto& ss : stop_strings_) cut = std::min(cut, s.text.find(ss));
      if (cut != std::string::npos) {
        // the shortest token prefix whose text reaches past the stop string
        for (size_t k = 1; k <= s.tokens.size(); ++k) {
          auto t = tok.decode(std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + static_cast<std::ptrdiff_t>(k)), true);
          bool hit = false;
          for (const auto& ss : stop_strings_) hit = hit || (t.ok() && t->find(ss) != std::string::npos);
          if (hit) {
            s.tokens.resize(k);
            s.logprobs.resize(k);
            s.experts.resize(k * route_width);
            s.text = *t;
            stopped = true;
            break;
          }
        }
      }
    }
    s.truncated = !stopped;
    if (in_flight_)
      for (const auto& [first, v] : switches)
        if (first < s.tokens.size() || first == 0) {
          s.version_starts.push_back(first);
          s.versions.push_back(v);
        }
  }
  wait_token_time(rep, cfg_.faults.generator_token_s);
  rep.generate_s = seconds_since(t0);
  return rep;
}

// One thread at a fixed nice value (0: as the process) that runs the jobs handed to it, one at a
// time in arrival order: post() returns at once, run() waits for its job. With
// rollout.in_flight_updates a generation is posted and replies itself, so that the actor's thread
// stays free for the Weights and StepVersion messages it waits for (an actor thread never blocks
// on mail only its own mailbox delivers).
class ComputeThread {
 public:
  ComputeThread(int nice, int threads) : thread_([this, nice, threads] { loop(nice, threads); }) {}
  ~ComputeThread() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard lk(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }
  void run(const std::function<void()>& job) {
    std::promise<void> done;
    post([&] {
      job();
      done.set_value();
    });
    done.get_future().wait();
  }

 private:
  void loop(int nice, int threads) {
    // Lowering one's own priority needs no privilege; threads started from here inherit it.
    if (nice != 0 && setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice) != 0)
      std::fprintf(stderr, "troupe: warning: generator nice %d: %s\n", nice, std::strerror(errno));
    use_threads(threads);
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;  // (jobs not started are dropped: their requester is going too)
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      job();
      lk.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

GeneratorActor::GeneratorActor(std::shared_ptr<Generator> gen, int threads, int nice, int index, bool own_process)
    : gen_(std::move(gen)), threads_(threads), index_(index), own_process_(own_process) {
  if (gen_->in_flight() || nice > 0) compute_ = std::make_unique<ComputeThread>(nice, threads);
  handle<GenerateReq>([this](runtime::Context& ctx, const GenerateReq& r) -> Status {
    const auto& f = gen_->config().faults;
    if (f.generator_death_step > 0 && r.step == f.generator_death_step && index_ == f.generator_death_rank) {
      const std::string what =
          "generator " + std::to_string(index_) + " killed as it samples step " + std::to_string(r.step);
      if (own_process_) die_by_fault(what);
      // one process: the generator's thread dies alone (its actor fails; what it was asked fails as peer_failed)
      std::fprintf(stderr, "troupe: fault injected: %s\n", what.c_str());
      Error died = make_error(ErrorCode::peer_failed, "generator " + std::to_string(index_) + " died (fault injected)");
      (void)ctx.reply_error(died);
      ctx.fail(died);
      return {};
    }
    if (pieces_->assembling()) {  // (async, from the shards: the version it names may be among them)
      deferred_.emplace_back(ctx.reply_later(), r);
      return {};
    }
    relay_->abort();  // (never samples with a delta half streamed in: the version it holds, bit for bit)
    if (gen_->in_flight()) {  // the reply leaves from the compute thread
      compute_->post([this, reply = ctx.reply_later(), r] {
        Result<GenerateRep> rep = gen_->generate(r);
        if (!reply) return;
        (void)(rep.ok() ? reply.send(std::move(rep).value()) : reply.send_error(rep.error()));
      });
      return {};
    }
    Result<GenerateRep> rep = Error{};
    if (compute_) {
      compute_->run([&] { rep = gen_->generate(r); });
    } else {
      use_threads(threads_);
      rep = gen_->generate(r);
    }
    if (!rep.ok()) return rep.error();
    return ctx.reply(std::move(rep).value());
  });
  handle<StepVersion>([this](runtime::Context&, const StepVersion& v) -> Status {
    gen_->step_done(v);
    return {};
  });
  handle<WeightGroupReq>([this](runtime::Context& ctx, const WeightGroupReq& r) -> Status {
    TROUPE_TRY(gen_->join_weight_group(r));
    return ctx.reply(WeightGroupRep{});
  });
  handle<ServedTurnsReq>([this](runtime::Context& ctx, const ServedTurnsReq& r) -> Status {
    return ctx.reply(ServedTurnsRep{gen_->served_turns().take(r.episode_id)});
  });
  handle<ServeAddressReq>([this](runtime::Context& ctx, const ServeAddressReq&) -> Status {
    return ctx.reply(ServeAddressRep{gen_->serve_url()});
  });
  // Sync mode: applied now. Async mode: decoded and checked now, held back until a GenerateReq
  // names its version (Generator::hold_weights). A request gets the Ack whatever happened (it
  // names what was not applied and why); a message sent without a reply fails the handler instead.
  handle<Weights>([this](runtime::Context& ctx, const Weights& w) -> Status {
    use_threads(threads_);
    relay_->abort();  // (a delta half streamed in by relay parts is undone first)
    Status st = gen_->receive_weights(w);
    if (ctx.header() && (ctx.header()->flags & runtime::kFlagRequest)) return ctx.reply(gen_->weights_ack());
    return st;
  });
  // weight_sync.relay_fanout: parts passed on to this generator's children as they come, the
  // whole message then applied as a Weights is (troupe/actors/weight_relay.h).
  // Sync mode: a delta is applied as its parts come (Generator::stream_weights_*).
  RelayApply take;
  take.apply = [this](const Weights& w) {
    use_threads(threads_);
    (void)gen_->stream_weights_end(w);  // (what was not applied, and why, is in the Ack)
    return gen_->weights_ack();
  };
  take.begin = [this](const Weights& head) { return gen_->stream_weights_begin(head); };
  take.feed = [this](const char* payload, std::size_t size) {
    use_threads(threads_);
    gen_->stream_weights_feed(payload, size);
  };
  take.abort = [this](const char* payload) { gen_->stream_weights_abort(payload); };
  relay_ = std::make_unique<RelayReceiver>(std::move(take));
  handle<WeightsPart>([this](runtime::Context& ctx, const WeightsPart& p) -> Status { return relay_->on_part(ctx, p); });
  // weights_from_shards: the learners' pieces put back together here, passed on down the relay
  // tree and applied as a Weights is (troupe/actors/weight_pieces.h).
  pieces_ = std::make_unique<PiecesReceiver>();
  handle<PiecesHead>([this](runtime::Context& ctx, const PiecesHead& h) -> Status {
    pieces_->on_head(ctx, h, [this](const Weights& w) { return apply_pieces(w); });
    replay_deferred();
    return {};
  });
  handle<WeightsPiece>([this](runtime::Context& ctx, const WeightsPiece& p) -> Status {
    Status st = pieces_->on_piece(ctx, p, [this](const Weights& w) { return apply_pieces(w); });
    replay_deferred();
    return st;
  });
}

void GeneratorActor::generate_later(runtime::ReplyTo reply, const GenerateReq& r) {
  relay_->abort();
  auto run = [this, reply, r] {
    Result<GenerateRep> rep = gen_->generate(r);
    if (!reply) return;
    (void)(rep.ok() ? reply.send(std::move(rep).value()) : reply.send_error(rep.error()));
  };
  if (gen_->in_flight()) {
    compute_->post(std::move(run));
  } else if (compute_) {
    compute_->run(run);
  } else {
    use_threads(threads_);
    run();
  }
}

void GeneratorActor::replay_deferred() {
  while (!deferred_.empty() && !pieces_->assembling()) {
    auto [reply, r] = std::move(deferred_.front());
    deferred_.pop_front();
    generate_later(std::move(reply), r);
  }
}

Ack GeneratorActor::apply_pieces(const Weights& w) {
  relay_->abort();  // (a delta half streamed in by relay parts is undone first)
  use_threads(threads_);
  (void)gen_->receive_weights(w);  // (what was not applied, and why, is in the Ack)
  return gen_->weights_ack();
}

GeneratorActor::~GeneratorActor() {
  relay_->abort();  // (a delta half streamed in: its thread stops before the parts it reads go)
  // a generation waiting for a step that will not come goes on with what it has, and ends
  if (gen_->in_flight()) gen_->step_done(StepVersion{0, 0, true});
}

}  // namespace troupe::actors
