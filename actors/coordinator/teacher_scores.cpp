// distill: the teacher's log-probs (and top-k) of every training sample, from the scorers, and the
// check at start that every scorer serves the same teacher files (its model_hash) with the student's
// tokenizer. Invariant: every sample trained
// on carries its teacher numbers, or the step fails naming the scorers and why (after retries on
// the next scorers, each try under distill.timeout_s; failures and retries are counted).
#include <chrono>

#include "coordinator_internal.h"
#include "troupe/learner/distill.h"

namespace troupe::actors::coord {

using runtime::Reply;
using runtime::request;

namespace {

constexpr size_t kSamplesPerRequest = 16;

runtime::Duration timeout_of(const ExperimentConfig& cfg) {
  return std::chrono::duration_cast<runtime::Duration>(std::chrono::duration<double>(cfg.distill.timeout_s));
}

// One request's answer, trying scorer first, then the next ones after a failure.
Task<Result<ScoreRep>> ask_scorers(RunState& s, const ScoreReq& req, Reply<ScoreRep> sent, size_t first,
                                   ScorerStats& stats, double t0) {
  const auto& scorers = s.peers.scorers;
  Result<ScoreRep> got = co_await sent;
  std::string why;
  for (int attempt = 0;; ++attempt) {
    const size_t k = (first + static_cast<size_t>(attempt)) % scorers.size();
    if (got.ok()) {
      stats.answered(mono_seconds() - t0, got->batch_requests);
      co_return got;
    }
    ++stats.failures;
    why += (why.empty() ? "" : "; ") + std::string("scorer ") + std::to_string(k) + ": " + got.error().message;
    if (attempt >= s.cfg.distill.max_retries) break;
    ++stats.retries;
    if (s.hooks.log) s.hooks.log("scorer " + std::to_string(k) + " failed (" + got.error().message + "): retrying on scorer " +
                                 std::to_string((k + 1) % scorers.size()));
    t0 = mono_seconds();
    got = co_await request<ScoreRep>(s.here, scorers[(k + 1) % scorers.size()], req, timeout_of(s.cfg));
  }
  co_return make_error(ErrorCode::peer_failed, "distill: the teacher's log-probs failed after " +
                                                   std::to_string(s.cfg.distill.max_retries + 1) + " tries (" + why +
                                                   ")");
}

}  // namespace

Task<Status> check_teacher(RunState& s) {
  if (!s.cfg.distill.enabled()) co_return Status{};
  if (s.peers.scorers.empty())
    co_return invalid_input("distill.teacher: set, but the run has no scorer to serve it (cluster.scorers: 0)");
  const std::string student = learner::tokenizer_fingerprint(*s.tokenizer);
  const std::string student_name = s.cfg.policy.path.empty() ? "(policy.tokenizer " + enum_string(s.cfg.policy.tokenizer) + ")"
                                                             : s.cfg.policy.path;
  ScoreReq req;
  req.kind = static_cast<int32_t>(ScoreKind::logprobs);
  req.model = s.cfg.distill.teacher;
  std::vector<Reply<ScoreRep>> reps;
  for (const auto& to : s.peers.scorers) reps.push_back(request<ScoreRep>(s.here, to, req, timeout_of(s.cfg)));
  std::string version;  // scorer 0's model_hash: every scorer must serve the same files
  for (size_t i = 0; i < reps.size(); ++i) {
    Result<ScoreRep> got = co_await reps[i];
    if (!got.ok())
      co_return Error{got.error().code, "distill.teacher: scorer " + std::to_string(i) + " cannot serve " +
                                            s.cfg.distill.teacher + ": " + got.error().message};
    TROUPE_CO_TRY(learner::check_distill_tokenizer_hashes(student, student_name, got->tokenizer_hash,
                                                          s.cfg.distill.teacher));
    if (i == 0) version = got->model_hash;
    if (got->model_hash != version)
      co_return invalid_input("distill.teacher: scorer " + std::to_string(i) + " serves " + s.cfg.distill.teacher +
                              " as " + got->model_hash + ", scorer 0 as " + version +
                              " (every scorer must load the same files)");
    if (s.hooks.log && i == 0)
      s.hooks.log("distill: teacher " + s.cfg.distill.teacher + " (" + got->model_hash + ") on " +
                  std::to_string(s.peers.scorers.size()) + " scorer(s)");
  }
  co_return Status{};
}

Task<Status> score_teacher(RunState& s, Prepared& p) {
  if (!s.cfg.distill.enabled() || p.samples.empty()) co_return Status{};
  const size_t n = p.samples.size();
  const int K = s.cfg.distill.topk;
  struct Chunk {
    size_t b = 0, e = 0, first = 0;
    ScoreReq req;
    double t0 = 0;
  };
  std::vector<Chunk> chunks;
  for (size_t b = 0, c = 0; b < n; b += kSamplesPerRequest, ++c) {
    Chunk ch;
    ch.b = b;
    ch.e = std::min(n, b + kSamplesPerRequest);
    ch.first = c % s.peers.scorers.size();
    ch.req.kind = static_cast<int32_t>(ScoreKind::logprobs);
    ch.req.model = s.cfg.distill.teacher;
    ch.req.topk = K;
    for (size_t i = ch.b; i < ch.e; ++i) {
      const auto& t = p.samples[i];
      std::vector<int32_t> seq = t.prompt;
      seq.insert(seq.end(), t.completion.begin(), t.completion.end());
      ch.req.sequences.push_back(std::move(seq));
      ch.req.starts.push_back(static_cast<int32_t>(t.prompt.size()));
    }
    chunks.push_back(std::move(ch));
  }
  std::vector<Reply<ScoreRep>> sent;  // every chunk requested at once: the scorers batch them
  for (auto& ch : chunks) {
    ch.t0 = mono_seconds();
    sent.push_back(request<ScoreRep>(s.here, s.peers.scorers[ch.first], ch.req, timeout_of(s.cfg)));
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    auto& ch = chunks[c];
    TROUPE_CO_ASSIGN_OR_RETURN(ScoreRep rep, co_await ask_scorers(s, ch.req, std::move(sent[c]), ch.first, p.scorer, ch.t0));
    if (rep.logprobs.size() != ch.e - ch.b || (K > 0 && rep.topk_ids.size() != ch.e - ch.b))
      co_return make_error(ErrorCode::internal, "distill: a scorer answered " + std::to_string(rep.logprobs.size()) +
                                                    " sequences for " + std::to_string(ch.e - ch.b));
    for (size_t i = ch.b; i < ch.e; ++i) {
      auto& t = p.samples[i];
      t.teacher_logprobs = std::move(rep.logprobs[i - ch.b]);
      if (K > 0) {
        t.teacher_topk_ids = std::move(rep.topk_ids[i - ch.b]);
        t.teacher_topk_logprobs = std::move(rep.topk_logprobs[i - ch.b]);
      }
    }
  }
  co_return Status{};
}

}  // namespace troupe::actors::coord
