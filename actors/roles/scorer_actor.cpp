// The ScorerActor (continuous batching of ScoreReq mail on a compute thread of its own) and the
// ScorerClient (a blocking caller with a deadline per try and retries on the next scorer).
// Invariant: every request gets exactly one answer, a reply or an error; a failed try is counted.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <thread>

#include "roles/role_support.h"
#include "troupe/actors/scorer.h"
#include "troupe/envs/local_model.h"

namespace troupe::actors {

struct ScorerActor::Queue {
  struct Item {
    ScoreReq req;
    runtime::ReplyTo reply;
    double queued_at = 0;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> items;
  bool stop = false;
  std::thread thread;
  // generate requests on their engines: their streams (cancelled when the actor stops) and how
  // many are not answered yet
  std::vector<std::shared_ptr<ServeStream>> streams;
  size_t generating = 0;

  // Hands a generate request to its model's engine; answered from the engine's thread when it ends.
  void submit(Scorer& scorer, Item& it, double start, size_t batch) {
    {
      std::lock_guard lk(mu);
      ++generating;
      std::erase_if(streams, [](const auto& s) { return s->finish() != ServeFinish::running; });
    }
    auto sent = scorer.submit_generate(it.req, [this, reply = it.reply, queued = start - it.queued_at,
                                                batch](Result<ScoreRep> r) {
      if (reply) {
        if (!r.ok()) {
          (void)reply.send_error(r.error());
        } else {
          r->queue_s = queued;
          r->batch_requests = static_cast<int32_t>(batch);
          (void)reply.send(std::move(r).value());
        }
      }
      std::lock_guard lk(mu);
      --generating;
      cv.notify_all();
    });
    std::lock_guard lk(mu);
    streams.insert(streams.end(), sent.begin(), sent.end());
  }

  void loop(const std::shared_ptr<Scorer>& scorer, int threads) {
    use_threads(threads);
    std::unique_lock lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return stop || !items.empty(); });
      if (stop) return;
      std::deque<Item> all;  // everything queued now: generations join their engine, the rest one batch
      all.swap(items);
      lk.unlock();
      const double start = mono_seconds();
      std::deque<Item> batch;
      for (auto& it : all)
        if (static_cast<ScoreKind>(it.req.kind) == ScoreKind::generate) submit(*scorer, it, start, all.size());
        else batch.push_back(std::move(it));
      std::vector<const ScoreReq*> reqs;
      for (const auto& it : batch) reqs.push_back(&it.req);
      auto results = scorer->run_batch(reqs);
      for (size_t i = 0; i < batch.size(); ++i) {
        const auto& it = batch[i];
        if (!it.reply) continue;
        if (!results[i].ok()) {
          (void)it.reply.send_error(results[i].error());
          continue;
        }
        ScoreRep rep = std::move(results[i]).value();
        rep.queue_s = start - it.queued_at;
        rep.batch_requests = static_cast<int32_t>(all.size());
        (void)it.reply.send(std::move(rep));
      }
      lk.lock();
    }
  }
};

ScorerActor::ScorerActor(std::shared_ptr<Scorer> scorer, int threads)
    : scorer_(std::move(scorer)), queue_(std::make_shared<Queue>()) {
  scorer_->set_threads(threads);
  queue_->thread = std::thread([q = queue_.get(), s = scorer_, threads] { q->loop(s, threads); });
  handle<ScoreReq>([this](runtime::Context& ctx, const ScoreReq& r) -> Status {
    {
      std::lock_guard lk(queue_->mu);
      queue_->items.push_back({r, ctx.reply_later(), mono_seconds()});
    }
    queue_->cv.notify_all();
    return {};
  });
}

ScorerActor::~ScorerActor() {
  std::deque<Queue::Item> left;
  {
    std::lock_guard lk(queue_->mu);
    queue_->stop = true;
    left.swap(queue_->items);
  }
  queue_->cv.notify_all();
  queue_->thread.join();
  for (const auto& it : left)  // never silent: what was queued learns that the scorer stopped
    if (it.reply) (void)it.reply.send_error(make_error(ErrorCode::peer_failed, "scorer stopped before the request ran"));
  std::unique_lock lk(queue_->mu);  // generations end cancelled at their engine's next step, answered
  for (const auto& s : queue_->streams) s->cancel();
  queue_->cv.wait(lk, [&] { return queue_->generating == 0; });
}

ScorerClient::ScorerClient(runtime::ActorSystem& sys, std::vector<runtime::ActorId> scorers, double timeout_s,
                           int max_retries)
    : sys_(sys), scorers_(std::move(scorers)), timeout_s_(timeout_s), max_retries_(max_retries) {}

namespace {
thread_local ScorerStats* counting = nullptr;  // CountScorerCalls: this thread's innermost scope
}  // namespace

CountScorerCalls::CountScorerCalls(ScorerStats& into) : previous_(counting) { counting = &into; }
CountScorerCalls::~CountScorerCalls() { counting = previous_; }

Result<ScoreRep> ScorerClient::call(const ScoreReq& r, size_t first) {
  if (scorers_.empty()) return invalid_input("scorer: the run has no scorers (cluster.scorers: 0)");
  std::string why;
  const auto deadline = std::chrono::duration_cast<runtime::Duration>(std::chrono::duration<double>(timeout_s_));
  for (int attempt = 0; attempt <= max_retries_; ++attempt) {
    const size_t k = (first + static_cast<size_t>(attempt)) % scorers_.size();
    const double t0 = mono_seconds();
    Result<ScoreRep> got = sys_.ask<ScoreRep>(scorers_[k], r, deadline).get();
    ScorerStats tried;  // this try, counted here and in the thread's CountScorerCalls
    if (attempt > 0) ++tried.retries;
    if (got.ok()) tried.answered(mono_seconds() - t0, got->batch_requests);
    else ++tried.failures;
    if (counting) counting->add(tried);
    std::lock_guard lk(mu_);
    stats_.add(tried);
    if (got.ok()) return got;
    why += (why.empty() ? "" : "; ") + std::string("scorer ") + std::to_string(k) + ": " + got.error().message;
  }
  return make_error(ErrorCode::peer_failed, "scorer request failed after " + std::to_string(max_retries_ + 1) +
                                                " tries (" + why + ")");
}

ScorerStats ScorerClient::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

namespace {
std::mutex peers_mu;
std::optional<ScorerPeers> peers;
}  // namespace

std::optional<ScorerPeers> scorer_peers() {
  std::lock_guard lk(peers_mu);
  return peers;
}

void set_scorer_peers(runtime::ActorSystem& sys, const std::vector<runtime::ActorId>& scorers,
                      const ExperimentConfig& cfg) {
  (void)cfg;
  {
    std::lock_guard lk(peers_mu);
    peers = scorers.empty() ? std::nullopt : std::optional<ScorerPeers>(ScorerPeers{&sys, scorers});
  }
  if (scorers.empty()) {
    envs::set_local_model_caller({});
    return;
  }
  runtime::ActorSystem* system = &sys;
  auto next = std::make_shared<std::atomic<size_t>>(0);  // each call starts at the next scorer in turn
  envs::set_local_model_caller([system, scorers, next](const envs::LocalModelRequest& r) -> Result<std::string> {
    ScorerClient client(*system, scorers, r.timeout_s, static_cast<int>(scorers.size()) - 1);
    ScoreReq req;
    req.kind = static_cast<int32_t>(ScoreKind::generate);
    req.model = r.model;
    req.prompts = {r.prompt};
    req.max_new_tokens = r.max_tokens;
    req.temperature = static_cast<float>(r.temperature);
    TROUPE_ASSIGN_OR_RETURN(ScoreRep rep, client.call(req, (*next)++ % scorers.size()));
    if (rep.texts.size() != 1) return make_error(ErrorCode::internal, "scorer: generate answered no text");
    return std::move(rep.texts[0]);
  });
}

}  // namespace troupe::actors
