// The Scorer plain object (scorer.h): loads frozen models, checks each request, and runs a batch of
// requests (log-probs one sequence per forward, generations on the model's engine, reward scores in
// one forward). Invariant: a sequence's log-probs, a prompt's generation and a sequence's score are
// bit-identical whatever else shares the batch (a forward of one sequence is a fixed batch; decode
// steps and score forwards run batch-invariant), so continuous batching never changes a run.
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <set>
#include <tuple>

#include "troupe/actors/chat_turns.h"
#include "roles/role_support.h"
#include "troupe/actors/scorer.h"
#include "troupe/learner/distill.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/io/reward_model_dir.h"

namespace troupe::actors {

namespace fs = std::filesystem;

Result<std::string> model_files_hash(const std::string& path) {
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    if (ec) return make_error(ErrorCode::io, "scorer: cannot list " + path + ": " + ec.message());
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(path, ec)) {
    files.push_back(path);
  } else {
    return invalid_input("scorer: model " + path + " is neither a model directory nor a file");
  }
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(1 << 20);
  for (const auto& f : files) {
    const std::string name = f.filename().string();
    XXH3_64bits_update(st, name.data(), name.size() + 1);
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      XXH3_freeState(st);
      return make_error(ErrorCode::io, "scorer: cannot read " + f.string());
    }
    uint64_t size = 0;
    while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
      XXH3_64bits_update(st, buf.data(), static_cast<size_t>(in.gcount()));
      size += static_cast<uint64_t>(in.gcount());
    }
    XXH3_64bits_update(st, &size, sizeof size);
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  char out[32];
  std::snprintf(out, sizeof out, "xxh3:%016llx", static_cast<unsigned long long>(h));
  return std::string(out);
}

std::vector<std::string> scorer_model_paths(const ExperimentConfig& cfg) {
  std::set<std::string> paths;
  if (cfg.distill.enabled()) paths.insert(cfg.distill.teacher);
  for (const auto& e : cfg.envs) {
    if (!e.config.is_object() || !e.config.contains("judge") || !e.config["judge"].is_object()) continue;
    const auto& j = e.config["judge"];
    if (j.value("url", std::string()).empty() && j.contains("model") && j["model"].is_string() &&
        !j["model"].get<std::string>().empty())
      paths.insert(j["model"].get<std::string>());
  }
  for (const auto& e : cfg.envs)
    if (e.type == EnvType::reward_model && !e.path.empty()) paths.insert(e.path);
  return {paths.begin(), paths.end()};
}

namespace {

// config.json's architectures[0] ends in ForSequenceClassification (a reward model).
bool is_sequence_classifier_dir(const std::string& path) {
  std::ifstream in(fs::path(path) / "config.json");
  if (!in) return false;
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string())
    return false;
  return j["architectures"][0].get<std::string>().ends_with("ForSequenceClassification");
}

Result<std::unique_ptr<ScorerModel>> load_reward_scorer_model(const std::string& path, const policy::ExecutionOptions& exec) {
  auto rm = policy::io::load_reward_model(path, exec);
  if (!rm.ok()) return Error{rm.error().code, "scorer: model " + path + ": " + rm.error().message};
  if (!rm->tokenizer) return invalid_input("scorer: model " + path + " has no tokenizer file");
  auto m = std::make_unique<ScorerModel>();
  m->name = path;
  m->model = std::make_unique<policy::Model>(std::move(rm->model));
  m->tokenizer = std::move(rm->tokenizer);
  m->head = std::make_unique<policy::ScoreHead>(std::move(rm->head));
  m->vocab_size = m->model->config().vocab_size;
  TROUPE_ASSIGN_OR_RETURN(m->model_hash, model_files_hash(path));
  m->tokenizer_hash = learner::tokenizer_fingerprint(*m->tokenizer);
  return m;
}

}  // namespace

Result<std::unique_ptr<Scorer>> Scorer::create(const std::vector<std::string>& paths, policy::ExecutionOptions exec,
                                               learner::TeacherDtype logprob_dtype) {
  // bf16 log-prob forwards: the CPU backend's matmul_forward on AVX512-BF16 (the device backends'
  // GEMMs are their own)
  const bool bf16 = logprob_dtype == learner::TeacherDtype::bf16 && exec.device == kernels::DeviceKind::cpu &&
                    kernels::cpu_has_avx512_bf16();
  // forward-only and batch-invariant: a sequence's numbers never depend on what shares its batch.
  // Checkpointing keeps only each layer's input (one layer's workspace for all): the forward is
  // the same computation, bit for bit, in a fraction of the memory (there is never a backward).
  exec.batch_invariant = true;
  exec.compute_dtype = kernels::ComputeDtype::fp32;
  exec.activation_checkpointing = true;
  exec.offload_activations = false;
  auto s = std::unique_ptr<Scorer>(new Scorer());
  for (const auto& path : paths) {
    if (s->models_.count(path)) continue;
    if (is_sequence_classifier_dir(path)) {
      TROUPE_ASSIGN_OR_RETURN(s->models_[path], load_reward_scorer_model(path, exec));
      continue;
    }
    auto loaded = policy::io::load_model(path, exec);
    if (!loaded.ok()) return Error{loaded.error().code, "scorer: model " + path + ": " + loaded.error().message};
    auto m = std::make_unique<ScorerModel>();
    m->name = path;
    m->model = std::make_unique<policy::Model>(std::move(loaded->model));
    m->vocab_size = m->model->config().vocab_size;
    if (!loaded->tokenizer) return invalid_input("scorer: model " + path + " has no tokenizer file");
    m->tokenizer = std::move(loaded->tokenizer);
    const auto& d = *loaded;
    if (d.bos_token_id >= 0 || d.eos_token_id >= 0)
      m->tokenizer->set_special_ids(d.bos_token_id >= 0 ? d.bos_token_id : m->tokenizer->bos_id(),
                                    d.eos_token_id >= 0 ? d.eos_token_id : m->tokenizer->eos_id(),
                                    d.pad_token_id >= 0 ? d.pad_token_id : m->tokenizer->pad_id());
    TROUPE_ASSIGN_OR_RETURN(m->model_hash, model_files_hash(path));
    m->tokenizer_hash = learner::tokenizer_fingerprint(*m->tokenizer);
    if (bf16) m->bf16 = std::make_unique<kernels::Bf16Weights>();
    s->models_[path] = std::move(m);
  }
  return s;
}

const ScorerModel* Scorer::find(const std::string& name) const {
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : it->second.get();
}

bool Scorer::bf16_logprobs(const std::string& path) const {
  const ScorerModel* m = find(path);
  return m && m->bf16;
}

std::vector<std::string> Scorer::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : models_) out.push_back(k);
  return out;
}

Status Scorer::check(const ScoreReq& r, const ScorerModel& m) const {
  const int V = m.vocab_size;
  if (m.head && static_cast<ScoreKind>(r.kind) != ScoreKind::sequence_score)
    return invalid_input("scorer: " + m.name + " is a sequence-classification model: it answers sequence_score requests only");
  switch (static_cast<ScoreKind>(r.kind)) {
    case ScoreKind::logprobs:
      if (r.starts.size() != r.sequences.size())
        return invalid_input("scorer: logprobs: " + std::to_string(r.starts.size()) + " starts for " +
                             std::to_string(r.sequences.size()) + " sequences");
      if (r.topk < 0 || r.topk > V)
        return invalid_input("scorer: logprobs: topk " + std::to_string(r.topk) + " outside [0, " + std::to_string(V) + "]");
      for (size_t i = 0; i < r.sequences.size(); ++i) {
        const auto& q = r.sequences[i];
        if (q.size() < 2)
          return invalid_input("scorer: logprobs: sequence " + std::to_string(i) + " has " + std::to_string(q.size()) +
                               " tokens (at least 2: a context and a scored token)");
        if (r.starts[i] < 1 || static_cast<size_t>(r.starts[i]) > q.size())
          return invalid_input("scorer: logprobs: sequence " + std::to_string(i) + " of " + std::to_string(q.size()) +
                               " tokens cannot start scoring at " + std::to_string(r.starts[i]));
        for (int32_t t : q)
          if (t < 0 || t >= V)
            return invalid_input("scorer: logprobs: sequence " + std::to_string(i) + " has token " + std::to_string(t) +
                                 ", outside the vocabulary of " + m.name + " (" + std::to_string(V) + ")");
      }
      return {};
    case ScoreKind::generate:
      if (r.max_new_tokens < 1) return invalid_input("scorer: generate: max_new_tokens must be >= 1");
      return {};
    case ScoreKind::sequence_score:  // reward models: one scalar per sequence from the score head
      if (!m.head) return invalid_input("scorer: sequence_score: " + m.name + " has no sequence-classification score head");
      for (size_t i = 0; i < r.sequences.size(); ++i) {
        if (r.sequences[i].empty()) return invalid_input("scorer: sequence_score: sequence " + std::to_string(i) + " is empty");
        for (int32_t t : r.sequences[i])
          if (t < 0 || t >= V)
            return invalid_input("scorer: sequence_score: sequence " + std::to_string(i) + " has token " + std::to_string(t) +
                                 ", outside the vocabulary of " + m.name + " (" + std::to_string(V) + ")");
      }
      return {};
  }
  return invalid_input("scorer: unknown request kind " + std::to_string(r.kind));
}

std::vector<Result<ScoreRep>> Scorer::run_batch(const std::vector<const ScoreReq*>& reqs) {
  std::vector<Result<ScoreRep>> out(reqs.size(), Error{ErrorCode::internal, "scorer: not run"});
  // per model: the log-prob requests without top-k, those with, the generate requests by settings
  std::map<std::tuple<std::string, int, int32_t, float, uint64_t>, std::vector<size_t>> groups;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const ScoreReq& r = *reqs[i];
    const ScorerModel* m = find(r.model);
    if (!m) {
      std::string served;
      for (const auto& n : names()) served += (served.empty() ? "" : ", ") + n;
      out[i] = invalid_input("scorer: no model '" + r.model + "' here (this scorer serves: " + served + ")");
      continue;
    }
    if (Status st = check(r, *m); !st.ok()) {
      out[i] = st.error();
      continue;
    }
    const bool gen = static_cast<ScoreKind>(r.kind) == ScoreKind::generate;
    const bool seq = static_cast<ScoreKind>(r.kind) == ScoreKind::sequence_score;
    auto key = gen   ? std::tuple{r.model, 2, r.max_new_tokens, r.temperature, r.seed}
               : seq ? std::tuple{r.model, 3, 0, 0.0f, uint64_t{0}}
                     : std::tuple{r.model, r.topk > 0 ? 1 : 0, 0, 0.0f, uint64_t{0}};
    groups[key].push_back(i);
  }
  // generate requests first (they decode on their engine's thread; log-prob forwards run between
  // its steps), then the forwards, then wait for the generations
  std::mutex mu;
  std::condition_variable cv;
  size_t generating = 0;
  for (const auto& [key, idx] : groups) {
    if (std::get<1>(key) != 2) continue;
    generating += idx.size();
    for (size_t i : idx)
      submit_generate(*reqs[i], [&, i](Result<ScoreRep> r) {
        std::lock_guard lk(mu);
        out[i] = std::move(r);
        if (--generating == 0) cv.notify_all();
      });
  }
  for (const auto& [key, idx] : groups) {
    ScorerModel& m = *models_.at(std::get<0>(key));
    if (std::get<1>(key) == 3) run_sequence_scores(m, idx, reqs, out);
    else if (std::get<1>(key) != 2) run_logprobs(m, idx, reqs, out);
  }
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return generating == 0; });
  return out;
}

Result<std::vector<int32_t>> Scorer::generate_prompt(ScorerModel& m, const std::string& text) {
  if (!m.chat_template_read) {
    TROUPE_ASSIGN_OR_RETURN(m.chat_template, policy::io::load_chat_template_dir(m.name));
    m.chat_template_read = true;
  }
  if (m.chat_template) {  // one user turn and the generation prompt; the template places BOS itself
    TROUPE_ASSIGN_OR_RETURN(ChatFormat f, make_chat_format(*m.tokenizer, m.chat_template));
    return encode_chat_prompt(f, *m.tokenizer, nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}}));
  }
  std::vector<int32_t> q;
  if (m.tokenizer->bos_id() >= 0) q.push_back(m.tokenizer->bos_id());
  TROUPE_ASSIGN_OR_RETURN(auto ids, m.tokenizer->encode(text));
  q.insert(q.end(), ids.begin(), ids.end());
  return q;
}

Status Scorer::with_model(ScorerModel& m, const std::function<Status(policy::Model&)>& task) {
  return m.engine ? m.engine->run_with_model(task) : task(*m.model);
}

Result<ServeEngine*> Scorer::engine_for(ScorerModel& m) {
  if (m.engine) return m.engine.get();
  ServeEngineOptions o;
  o.slots = kScorerSlots;
  o.context = std::min(kScorerContext, std::max(2, m.model->config().max_position_embeddings));
  o.threads = threads_;
  auto e = ServeEngine::create(std::move(m.model), o);
  if (!e.ok()) return Error{e.error().code, "scorer: " + m.name + ": " + e.error().message};
  m.engine = std::move(e).value();
  return m.engine.get();
}

namespace {

// Every successful reply of a batch names the model that made it and the batch's compute time.
void stamp_replies(const ScorerModel& m, const std::vector<size_t>& idx, double secs,
                   std::vector<Result<ScoreRep>>& out) {
  for (size_t i : idx)
    if (out[i].ok()) {
      out[i]->model_hash = m.model_hash;
      out[i]->tokenizer_hash = m.tokenizer_hash;
      out[i]->compute_s = secs;
    }
}

// log-softmax of one row of logits (double), the target's value and the top k (ties: lower id first).
void row_logprobs(const float* logits, int V, int32_t target, int k, float* target_out, int32_t* ids, float* lps,
                  std::vector<int32_t>& order) {
  double mx = logits[0];
  for (int v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(logits[v]));
  double sum = 0;
  for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[v]) - mx);
  const double lse = mx + std::log(sum);
  *target_out = static_cast<float>(static_cast<double>(logits[target]) - lse);
  order.resize(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (int j = 0; j < k; ++j) {
    ids[j] = order[static_cast<size_t>(j)];
    lps[j] = static_cast<float>(static_cast<double>(logits[order[static_cast<size_t>(j)]]) - lse);
  }
}

}  // namespace

namespace {

// Batch invariance off while it lives (the model's default, blocked kernels), as before after: a
// forward of one sequence is a fixed batch, so what it gives depends on that sequence alone.
class DefaultKernels {
 public:
  explicit DefaultKernels(policy::Model& m) : m_(m), prev_(m.config().batch_invariant) { m_.set_batch_invariant(false); }
  ~DefaultKernels() { m_.set_batch_invariant(prev_); }
  DefaultKernels(const DefaultKernels&) = delete;
  DefaultKernels& operator=(const DefaultKernels&) = delete;

 private:
  policy::Model& m_;
  bool prev_;
};

// One sequence's reply rows: log p(q[t+1] | q[..t]) for t >= start - 1, and with k > 0 the top k
// of each row. Its own forward, so its numbers never depend on another sequence.
Status score_one(policy::Model& model, const std::vector<int32_t>& q, size_t start, int k, int V,
                 std::vector<float>& lp, std::vector<int32_t>& ids, std::vector<float>& tl, std::vector<float>& logits) {
  policy::PackedBatch batch;
  batch.tokens.assign(q.begin(), q.end() - 1);
  batch.targets.assign(q.begin() + 1, q.end());
  batch.cu_seqlens = {0, static_cast<int32_t>(batch.tokens.size())};
  const size_t n = batch.tokens.size(), K = static_cast<size_t>(k);
  lp.assign(n + 1 - start, 0.0f);
  ids.assign(k > 0 ? lp.size() * K : 0, 0);
  tl.assign(ids.size(), 0.0f);
  if (k == 0) {
    std::vector<float> all(n);
    TROUPE_TRY(model.forward_train(batch, 1.0f, all.data(), nullptr));
    std::copy(all.begin() + static_cast<std::ptrdiff_t>(start - 1), all.end(), lp.begin());
    return {};
  }
  logits.resize(n * static_cast<size_t>(V));
  TROUPE_TRY(model.forward_logits(batch, logits.data()));
  std::vector<int32_t> order;
  for (size_t t = start - 1; t < n; ++t) {
    const size_t u = t + 1 - start;
    row_logprobs(logits.data() + t * static_cast<size_t>(V), V, q[t + 1], k, &lp[u], ids.data() + u * K,
                 tl.data() + u * K, order);
  }
  return {};
}

}  // namespace

// Each sequence in a forward of its own with the default kernels (not the batch-invariant ones the
// decode steps need): one sequence of 256 tokens already makes GEMMs of 255 rows, which the blocked
// kernels run several times faster than the invariant chain, and no sequence ever shares a GEMM, so
// a reply never depends on what else was queued. Requests go whole into tasks of at most
// max_batch_tokens tokens (a longer one alone): on a model with an engine, one task between two
// decode steps.
void Scorer::run_logprobs(ScorerModel& m, const std::vector<size_t>& idx, const std::vector<const ScoreReq*>& reqs,
                          std::vector<Result<ScoreRep>>& out) {
  const int V = m.vocab_size;
  const double t0 = mono_seconds();
  size_t a = 0;
  while (a < idx.size()) {
    size_t b = a, tokens = 0;
    while (b < idx.size()) {
      size_t n = 0;
      for (const auto& q : reqs[idx[b]]->sequences) n += q.size() - 1;
      if (b > a && tokens + n > static_cast<size_t>(max_batch_tokens_)) break;
      tokens += n;
      ++b;
    }
    std::vector<ScoreRep> reps(b - a);
    Status st = with_model(m, [&](policy::Model& model) -> Status {
      DefaultKernels fast(model);
      kernels::Bf16WeightsScope bf16(m.bf16.get());  // distill.teacher_dtype: bf16 (null: fp32)
      std::vector<float> logits;
      for (size_t i = a; i < b; ++i) {
        const ScoreReq& r = *reqs[idx[i]];
        ScoreRep& rep = reps[i - a];
        for (size_t s = 0; s < r.sequences.size(); ++s) {
          std::vector<float> lp, tl;
          std::vector<int32_t> ids;
          TROUPE_TRY(score_one(model, r.sequences[s], static_cast<size_t>(r.starts[s]), r.topk, V, lp, ids, tl, logits));
          rep.logprobs.push_back(std::move(lp));
          if (r.topk > 0) {
            rep.topk_ids.push_back(std::move(ids));
            rep.topk_logprobs.push_back(std::move(tl));
          }
        }
      }
      return {};
    });
    for (size_t i = a; i < b; ++i)
      if (st.ok()) out[idx[i]] = std::move(reps[i - a]);
      else out[idx[i]] = Error{st.error().code, "scorer: " + m.name + ": " + st.error().message};
    a = b;
  }
  stamp_replies(m, idx, mono_seconds() - t0, out);
}

// Every sequence of the batch's sequence_score requests in one packed forward (batch-invariant:
// a sequence's score never depends on the others).
void Scorer::run_sequence_scores(ScorerModel& m, const std::vector<size_t>& idx, const std::vector<const ScoreReq*>& reqs,
                                 std::vector<Result<ScoreRep>>& out) {
  const double t0 = mono_seconds();
  std::vector<std::vector<int32_t>> all;
  for (size_t i : idx) all.insert(all.end(), reqs[i]->sequences.begin(), reqs[i]->sequences.end());
  auto scores = policy::score_sequences(*m.model, *m.head, all);
  const double secs = mono_seconds() - t0;
  size_t n = 0;
  for (size_t i : idx) {
    if (!scores.ok()) {
      out[i] = Error{scores.error().code, "scorer: " + m.name + ": " + scores.error().message};
      continue;
    }
    ScoreRep rep;
    rep.scores.assign(scores->begin() + static_cast<std::ptrdiff_t>(n),
                      scores->begin() + static_cast<std::ptrdiff_t>(n + reqs[i]->sequences.size()));
    n += reqs[i]->sequences.size();
    rep.model_hash = m.model_hash;
    rep.tokenizer_hash = m.tokenizer_hash;
    rep.compute_s = secs;
    out[i] = std::move(rep);
  }
}

namespace {

// A generate request in flight: each prompt's tokens as its stream ended, the reply once all have.
struct PendingGenerate {
  std::mutex mu;
  size_t left = 0;
  std::vector<std::vector<int32_t>> tokens;
  std::string error;  // the first prompt that did not end with stop or length, and why
  std::function<void(Result<ScoreRep>)> done;
  const ScorerModel* model = nullptr;
  double t0 = 0;

  // Prompt p's stream ended; the last one answers the request.
  void ended(size_t p, ServeStream& s) {
    std::vector<int32_t> toks;
    policy::SlotToken t;
    while (s.next(&t)) toks.push_back(t.token);
    const ServeFinish f = s.finish();
    std::lock_guard lk(mu);
    tokens[p] = std::move(toks);
    if ((f == ServeFinish::cancelled || f == ServeFinish::error) && error.empty())
      error = "prompt " + std::to_string(p) + (f == ServeFinish::cancelled ? ": cancelled (the scorer stopped)" : ": " + s.error());
    if (--left == 0) answer();
  }
  void answer() {
    if (!error.empty())
      return done(make_error(ErrorCode::peer_failed, "scorer: generate with " + model->name + ": " + error));
    ScoreRep rep;
    const int32_t eos = model->tokenizer->eos_id();
    for (auto& toks : tokens) {
      if (!toks.empty() && toks.back() == eos) toks.pop_back();
      auto text = model->tokenizer->decode(toks, true);
      if (!text.ok()) return done(Error{text.error().code, "scorer: generate: " + text.error().message});
      rep.texts.push_back(std::move(text).value());
    }
    rep.model_hash = model->model_hash;
    rep.tokenizer_hash = model->tokenizer_hash;
    rep.compute_s = mono_seconds() - t0;
    done(std::move(rep));
  }
};

}  // namespace

std::vector<std::shared_ptr<ServeStream>> Scorer::submit_generate(const ScoreReq& r,
                                                                  std::function<void(Result<ScoreRep>)> done) {
  auto it = models_.find(r.model);
  if (it == models_.end() || static_cast<ScoreKind>(r.kind) != ScoreKind::generate) {
    done(run(r));  // an unknown model (named with what this scorer serves) or another kind
    return {};
  }
  ScorerModel& m = *it->second;
  if (Status st = check(r, m); !st.ok()) return done(st.error()), std::vector<std::shared_ptr<ServeStream>>{};
  std::vector<ServeRequest> reqs;
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    auto ids = generate_prompt(m, r.prompts[p]);
    if (!ids.ok())
      return done(Error{ids.error().code, "scorer: generate: prompt " + std::to_string(p) + " with " + m.name + ": " +
                                              ids.error().message}),
             std::vector<std::shared_ptr<ServeStream>>{};
    ServeRequest q;
    q.prompt = std::move(ids).value();
    q.sampling.temperature = r.temperature;
    q.sampling.seed = r.seed;
    q.sampling.stream = static_cast<int>(p);  // a prompt's draws: its index in its own request
    q.max_tokens = r.max_new_tokens;
    if (m.tokenizer->eos_id() >= 0) q.stop_tokens.push_back(m.tokenizer->eos_id());
    reqs.push_back(std::move(q));
  }
  auto pending = std::make_shared<PendingGenerate>();
  pending->left = reqs.size();
  pending->tokens.resize(reqs.size());
  pending->done = std::move(done);
  pending->model = &m;
  pending->t0 = mono_seconds();
  if (reqs.empty()) return pending->answer(), std::vector<std::shared_ptr<ServeStream>>{};
  auto engine = engine_for(m);
  if (!engine.ok()) return pending->done(engine.error()), std::vector<std::shared_ptr<ServeStream>>{};
  std::vector<std::shared_ptr<ServeStream>> streams;
  for (size_t p = 0; p < reqs.size(); ++p) {
    reqs[p].on_end = [pending, p](ServeStream& s) { pending->ended(p, s); };
    streams.push_back((*engine)->submit(std::move(reqs[p])));
  }
  return streams;
}

}  // namespace troupe::actors
