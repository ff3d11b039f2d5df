// Simulated env workers, generators and learners (simulated_roles.h): each answers the
// coordinator's real messages with replies of the real shape and size, sent by a timer of the
// manual clock after the time SimTiming gives. Random draws (completion lengths, env latencies,
// rewards) are hashes of the seed and what is asked, so a simulation is the same every run.
#include "simulated_roles.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "troupe/actors/coordinator.h"
#include "troupe/actors/messages.h"
#include "troupe/actors/weight_relay.h"

namespace troupe::bench::sim {

using runtime::Clock;
using runtime::Context;
using actors::Ack;
using actors::EnvAggregateRep;
using actors::EnvAggregateReq;
using actors::EnvObs;
using actors::EnvReleaseReq;
using actors::EnvResetReq;
using actors::EnvVerifyRep;
using actors::EnvVerifyReq;
using actors::GenSample;
using actors::GenerateRep;
using actors::GenerateReq;
using actors::GetWeightsReq;
using actors::TrainRep;
using actors::TrainReq;
using actors::mix_seed;
using actors::RelayAck;
using actors::Weights;
using actors::WeightsPart;

Clock::time_point SimWorld::send_on_link(Clock::time_point now, double bytes) {
  const auto start = std::max(now, link_free);
  link_free = start + std::chrono::duration_cast<runtime::Duration>(
                          std::chrono::duration<double>(bytes / cfg.timing.link_bytes_per_s));
  return link_free;
}

namespace {

runtime::Duration seconds(double s) {
  return std::chrono::duration_cast<runtime::Duration>(std::chrono::duration<double>(std::max(0.0, s)));
}

uint64_t hash_text(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A uniform draw in [0, 1) from a 64-bit hash.
double unit(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

// The reply to the request being handled, sent by a timer `delay_s` simulated seconds from now.
template <class M>
void reply_after(Context& ctx, SimWorld& w, double delay_s, M msg) {
  runtime::ReplyTo reply = ctx.reply_later();
  if (!reply) return;  // (a plain send: nothing to answer)
  const auto delay = seconds(delay_s);
  w.due.push(ctx.now() + delay);
  ++w.messages;
  ctx.after(delay, [&w, reply, m = std::move(msg)](Context&) mutable {
    RoleCpu cpu(w);
    (void)reply.send(std::move(m));
  });
}

class SimEnv : public runtime::Actor {
 public:
  SimEnv(SimWorld& w, int index) : w_(w), index_(index) {
    handle<EnvResetReq>([this](Context& ctx, const EnvResetReq& r) {
      RoleCpu cpu(w_);
      EnvObs obs;
      const uint64_t h = mix_seed(w_.cfg.seed, r.seed, seed_stream::sim_env_prompt);
      obs.text = std::to_string(h % 10) + "+" + std::to_string((h >> 8) % 10) + "=";
      obs.metadata_json = "{\"answer\":" + std::to_string(h % 10 + (h >> 8) % 10) + "}";
      reply_after(ctx, w_, latency(h), std::move(obs));
    });
    handle<EnvVerifyReq>([this](Context& ctx, const EnvVerifyReq& r) {
      RoleCpu cpu(w_);
      EnvVerifyRep rep;
      const size_t n = r.completions.size();
      uint64_t h = mix_seed(w_.cfg.seed, hash_text(r.metadata_json), seed_stream::sim_env_verify, static_cast<uint64_t>(calls_++));
      for (const auto& c : r.completions) {
        const double reward = (hash_text(c) ^ h) % 3 == 0 ? 1.0 : 0.0;  // about a third solved
        rep.rewards.push_back(reward);
        rep.correct.push_back(reward);
      }
      rep.errors.assign(n, "");
      rep.reasons.assign(n, "");
      rep.components_json.assign(n, "{}");
      reply_after(ctx, w_, latency(h), std::move(rep));
    });
    handle<EnvReleaseReq>([](Context&, const EnvReleaseReq&) {});
    handle<EnvAggregateReq>([this](Context& ctx, const EnvAggregateReq&) {
      RoleCpu cpu(w_);
      reply_after(ctx, w_, 2 * w_.cfg.timing.message_s, EnvAggregateRep{});
    });
  }

 private:
  // A call's latency: log-normal (median, sigma) plus the request and the reply on the wire.
  double latency(uint64_t h) const {
    const auto& t = w_.cfg.timing;
    const double u1 = std::max(1e-12, unit(mix_seed(h, seed_stream::sim_latency_u1, static_cast<uint64_t>(index_))));
    const double u2 = unit(mix_seed(h, seed_stream::sim_latency_u2, static_cast<uint64_t>(index_)));
    const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    return t.env_median_s * std::exp(t.env_sigma * normal) + 2 * t.message_s;
  }
  SimWorld& w_;
  int index_;
  std::uint64_t calls_ = 0;
};

class SimGenerator : public runtime::Actor {
 public:
  explicit SimGenerator(SimWorld& w) : w_(w) {
    handle<GenerateReq>([this](Context& ctx, const GenerateReq& r) {
      RoleCpu cpu(w_);
      const auto& cfg = w_.cfg;
      GenerateRep rep;
      rep.policy_version = r.policy_version >= 0 ? r.policy_version : held_;
      const size_t n = std::max(r.prompts.size(), r.prompt_tokens.size());
      int longest = 0;
      rep.samples.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t stream = i < r.sampling.streams.size() ? static_cast<uint64_t>(r.sampling.streams[i]) : i;
        const uint64_t h = mix_seed(r.sampling.seed, stream, seed_stream::sim_response_length);
        const int lo = std::min(cfg.min_response_tokens, r.sampling.max_new_tokens);
        const int len = lo + static_cast<int>(h % static_cast<uint64_t>(r.sampling.max_new_tokens - lo + 1));
        longest = std::max(longest, len);
        GenSample x;
        x.prompt_tokens.assign(static_cast<size_t>(cfg.prompt_tokens), 3);
        x.tokens.assign(static_cast<size_t>(len), 4);
        x.logprobs.assign(static_cast<size_t>(len), -1.0f);
        x.text = std::to_string((h >> 20) % 10);
        x.truncated = len == r.sampling.max_new_tokens;
        rep.samples.push_back(std::move(x));
      }
      const auto& t = cfg.timing;
      const double busy = n == 0 ? 0.0 : t.prefill_s + longest * t.decode_step_s;
      // one request at a time: a request that comes while the last one runs waits for it, and
      // one that names a version waits until that version's weights are here
      auto start = std::max(ctx.now(), busy_until_);
      if (auto it = ready_.find(r.policy_version); it != ready_.end()) start = std::max(start, it->second);
      busy_until_ = start + seconds(busy);
      const double delay = std::chrono::duration<double>(busy_until_ - ctx.now()).count() + 2 * t.message_s;
      reply_after(ctx, w_, delay, std::move(rep));
    });
    handle<Weights>([this](Context& ctx, const Weights& wts) {
      RoleCpu cpu(w_);
      const auto& t = w_.cfg.timing;
      held_ = std::max(held_, wts.version);
      const bool delta = wts.encoding == 2;  // WeightEncoding::delta
      const auto arrived = w_.send_on_link(ctx.now(), delta ? t.delta_bytes : t.weights_bytes);
      ready_[wts.version] = arrived + seconds(t.weights_apply_s);
      while (ready_.size() > 8) ready_.erase(ready_.begin());
      const double delay = std::chrono::duration<double>(arrived - ctx.now()).count() + t.weights_apply_s + 2 * t.message_s;
      Ack ack;
      ack.value = wts.version;
      ack.version = wts.version;
      reply_after(ctx, w_, delay, std::move(ack));
    });
    handle<WeightsPart>([this](Context& ctx, const WeightsPart& p) { relay(ctx, p); });
  }

 private:
  // weight_sync.relay_fanout: this generator's copy arrives in its window (from learner 0's link,
  // or its parent's: SimWorld::relay_window), and it passes the version on over its own link to each
  // child, one after another, each copy starting a part after its own bytes started and ending no
  // sooner than a part after they ended (parts are passed on as they come). The subtree's RelayAck
  // goes up once every child answered and its own copy is applied.
  void relay(Context& ctx, const WeightsPart& p) {
    RoleCpu cpu(w_);
    if (p.part + 1 < p.parts) return;  // (the simulated payload is empty: one part)
    const auto& t = w_.cfg.timing;
    const double bytes = p.head.encoding == 2 ? t.delta_bytes : t.weights_bytes;  // WeightEncoding::delta
    const auto dur = seconds(bytes / t.link_bytes_per_s);
    Clock::time_point start, end;
    if (auto it = w_.relay_window.find(ctx.self().packed()); it != w_.relay_window.end()) {
      start = it->second.first;
      end = it->second.second;
      w_.relay_window.erase(it);
    } else {
      end = w_.send_on_link(ctx.now(), bytes);
      start = end - dur;
    }
    held_ = std::max(held_, p.version);
    ready_[p.version] = end + seconds(t.weights_apply_s);
    while (ready_.size() > 8) ready_.erase(ready_.begin());
    struct Pending {
      runtime::ReplyTo reply;
      RelayAck ack;
      size_t left = 0;
      void one_done() {
        if (--left == 0 && reply) (void)reply.send(std::move(ack));
      }
    };
    auto agg = std::make_shared<Pending>();
    agg->reply = ctx.reply_later();
    Ack own;
    own.value = own.version = p.version;
    agg->ack.index.push_back(p.to_index);
    agg->ack.acks.push_back(own);
    const auto children = actors::relay_children(actors::relay_targets(p), p.fanout);
    agg->left = children.size() + 1;
    const auto part = seconds(static_cast<double>(actors::kRelayPartBytes) / t.link_bytes_per_s + t.message_s);
    for (const auto& c : children) {
      const auto cstart = std::max(start + part, link_free_);
      const auto cend = std::max(cstart + dur, end + part);
      link_free_ = cend;
      w_.relay_window[c.node.id.packed()] = {cstart, cend};
      WeightsPart out;
      out.version = p.version;
      out.head = p.head;
      out.fanout = p.fanout;
      out.to_index = c.node.index;
      for (const auto& b : c.below) {
        out.subtree.push_back(b.id.packed());
        out.index.push_back(b.index);
      }
      agg->ack.relayed_bytes += static_cast<std::uint64_t>(bytes);
      ctx.request<RelayAck>(c.node.id, std::move(out), std::chrono::hours(2), [agg](Context&, Result<RelayAck> r) {
        if (r.ok()) {
          agg->ack.index.insert(agg->ack.index.end(), r->index.begin(), r->index.end());
          agg->ack.acks.insert(agg->ack.acks.end(), r->acks.begin(), r->acks.end());
          agg->ack.relayed_bytes += r->relayed_bytes;
        }
        agg->one_done();
      });
    }
    const auto due = std::max(ctx.now(), ready_[p.version] + seconds(t.message_s));
    w_.due.push(due);
    ++w_.messages;
    ctx.after(due - ctx.now(), [this, agg](Context&) {
      RoleCpu c(w_);
      agg->one_done();
    });
  }

  SimWorld& w_;
  std::int64_t held_ = 0;
  Clock::time_point link_free_{};  // this generator's link (relaying): busy until then
  Clock::time_point busy_until_{};
  std::map<std::int64_t, Clock::time_point> ready_;  // version -> when its weights are applied here
};

class SimLearner : public runtime::Actor {
 public:
  SimLearner(SimWorld& w, int index) : w_(w), index_(index) {
    handle<TrainReq>([this](Context& ctx, const TrainReq& r) {
      RoleCpu cpu(w_);
      const auto& cfg = w_.cfg;
      const auto& t = cfg.timing;
      double tokens = 0, bytes = 0;
      for (const auto& x : r.samples) {
        tokens += static_cast<double>(x.prompt.size() + x.completion.size());
        // what a real learner is sent per sample: tokens, mask and log-probs, 4 bytes each
        bytes += 4.0 * static_cast<double>(x.prompt.size() + 3 * x.completion.size());
        if (index_ == 0 && x.policy_version >= 0) ++w_.staleness[version_ - x.policy_version];
      }
      // every learner is sent the whole batch over rank 0's link, one after another
      const auto arrived = w_.send_on_link(ctx.now(), bytes);
      double doublings = std::ceil(std::log2(static_cast<double>(cfg.learners)));
      const double compute = tokens / cfg.learners * t.train_token_s + (r.more ? 0.0 : doublings * t.allreduce_s);
      const auto start = std::max(arrived, busy_until_);
      busy_until_ = start + seconds(compute);
      if (!r.more) ++version_;
      TrainRep rep;
      rep.metrics_json = "{\"loss\":0.0}";
      rep.policy_version = version_;
      rep.train_s = compute;
      const double delay = std::chrono::duration<double>(busy_until_ - ctx.now()).count() + 2 * t.message_s;
      reply_after(ctx, w_, delay, std::move(rep));
    });
    handle<GetWeightsReq>([this](Context& ctx, const GetWeightsReq& r) {
      RoleCpu cpu(w_);
      Weights wts;  // the size travels in the simulated time of each generator's copy (SimGenerator)
      wts.version = version_;
      if (r.base_version >= 0) {  // a delta against what the generators hold, else the full weights
        wts.encoding = 2;
        wts.base_version = r.base_version;
      } else {
        wts.encoding = 1;
      }
      const auto start = std::max(ctx.now(), busy_until_);
      const double delay = std::chrono::duration<double>(start - ctx.now()).count() + 2 * w_.cfg.timing.message_s;
      reply_after(ctx, w_, delay, std::move(wts));
    });
  }

 private:
  SimWorld& w_;
  int index_;
  std::int64_t version_ = 0;
  Clock::time_point busy_until_{};
};

}  // namespace

std::unique_ptr<runtime::Actor> make_sim_env(SimWorld& w, int index) { return std::make_unique<SimEnv>(w, index); }
std::unique_ptr<runtime::Actor> make_sim_generator(SimWorld& w) { return std::make_unique<SimGenerator>(w); }
std::unique_ptr<runtime::Actor> make_sim_learner(SimWorld& w, int index) {
  return std::make_unique<SimLearner>(w, index);
}

}  // namespace troupe::bench::sim
