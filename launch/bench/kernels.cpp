// `troupe bench kernels`: the three training optimizations measured on vs off (and, in
// quant_gemv.cpp, the quantized-weight matvecs against fp32).
// moe_* cases time the MoE kernels alone (8k tokens, top-2); the step cases time a full training
// step of the policy model with its switches. Ours and the baseline are interleaved per repetition.
#include <algorithm>
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "quant_gemv.h"
#include "troupe/bench/bench.h"
#include "troupe/kernels/backend.h"
#include "troupe/kernels/expert_gemm.h"
#include "troupe/kernels/moe.h"
#include "troupe/kernels/offload.h"
#include "troupe/learner/optimizer.h"
#include "troupe/policy/model.h"
#include "troupe/policy/model_config.h"

namespace troupe::bench {
namespace {

constexpr const char* kSuite = "kernels";

std::vector<float> random_vec(size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& f : v) f = nd(rng);
  return v;
}

// One MoE layer's buffers at bench size.
struct MoeBench {
  kernels::MoeConfig cfg;
  int N;
  std::vector<float> x, wr, wg, wu, wd, out, saved, scratch, dout, dinp, dwr, dwg, dwu, dwd;
  MoeBench(int E, int N_, int C, int H) : N(N_) {
    cfg.C = C;
    cfg.H = H;
    cfg.E = E;
    cfg.K = 2;
    const size_t NC = static_cast<size_t>(N) * C, EHC = static_cast<size_t>(E) * H * C;
    x = random_vec(NC, 1, 1.0f);
    wr = random_vec(static_cast<size_t>(E) * C, 2, 0.1f);
    wg = random_vec(EHC, 3, 0.06f);
    wu = random_vec(EHC, 4, 0.06f);
    wd = random_vec(EHC, 5, 0.06f);
    dout = random_vec(NC, 6, 1.0f);
    out.resize(NC);
    dinp.resize(NC);
    dwr.assign(wr.size(), 0.0f);
    dwg.assign(EHC, 0.0f);
    dwu.assign(EHC, 0.0f);
    dwd.assign(EHC, 0.0f);
    saved.resize(kernels::moe_saved_floats(cfg, N));
    scratch.resize(kernels::moe_scratch_floats(cfg, N));
  }
  // Seconds for one forward + backward.
  double layer(bool grouped) {
    cfg.grouped = grouped;
    kernels::MoeWeights w{wr.data(), wg.data(), wu.data(), wd.data(), nullptr, nullptr, nullptr, {}};
    kernels::MoeGrads g{dwr.data(), dwg.data(), dwu.data(), dwd.data(), nullptr, nullptr, nullptr, {}};
    return time_s([&] {
      kernels::moe_forward(out.data(), saved.data(), nullptr, x.data(), w, cfg, N, scratch.data());
      kernels::moe_backward(dinp.data(), g, dout.data(), 0.0f, x.data(), saved.data(), w, cfg, N, scratch.data());
    });
  }
  // The router's top-k for x, computed once: the dispatcher is timed from there (the gate is the
  // same work in both paths; moe_layer_* times it with the rest).
  std::vector<int32_t> top_experts;
  std::vector<float> top_weights, dweights;
  void route_once() {
    kernels::MoeWeights w{wr.data(), wg.data(), wu.data(), wd.data(), nullptr, nullptr, nullptr, {}};
    kernels::moe_forward(out.data(), saved.data(), nullptr, x.data(), w, cfg, N, scratch.data());
    auto R = kernels::moe_saved_routing(saved.data(), cfg, N);
    const size_t nk = static_cast<size_t>(N) * cfg.K;
    top_experts.assign(R.experts, R.experts + nk);
    top_weights.assign(R.weights, R.weights + nk);
    dweights.resize(nk);
  }
  // Seconds for one forward + backward, the mean of kDispatchCalls back to back (a call is ~ms).
  static constexpr int kDispatchCalls = 10;
  double dispatch(bool grouped) {
    if (top_experts.empty()) route_once();
    cfg.grouped = grouped;
    return time_s([&] {
             for (int i = 0; i < kDispatchCalls; ++i) {
               kernels::moe_dispatch_forward(out.data(), saved.data(), top_experts.data(), top_weights.data(),
                                             x.data(), cfg, N, scratch.data());
               kernels::moe_dispatch_backward(dinp.data(), dweights.data(), dout.data(), x.data(),
                                              saved.data(), cfg, N, scratch.data());
             }
           }) /
           kDispatchCalls;
  }
};

void moe_cases(const BenchOptions& opt, int reps) {
  const int N = 8192, C = 128, H = 128;  // the policy tiny MoE: d_model 128, moe_intermediate_size 128
  for (int E : {8, 32, 64}) {
    const std::string dcase = "moe_dispatch_e" + std::to_string(E);
    const std::string lcase = "moe_layer_e" + std::to_string(E);
    if (!opt.wants(dcase) && !opt.wants(lcase)) continue;
    MoeBench b(E, N, C, H);
    nlohmann::json extra = {{"tokens", N}, {"top_k", 2}, {"experts", E}, {"d_model", C}, {"expert_hidden", H},
                            {"scans_per_layer_ours", 1}, {"scans_per_layer_baseline", E},
                            // the masked loop forks ~E times more parallel regions, so how idle OpenMP
                            // threads wait weighs on it most (troupe sets PASSIVE unless the user chose;
                            // ACTIVE, spinning, is the masked loop's best on an otherwise idle machine)
                            {"omp_wait_policy", std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "unset"},
                            {"stream_bytes", kernels::moe_stream_bytes()}};
    if (opt.wants(dcase)) {
      b.dispatch(true);
      b.dispatch(false);
      // a figure is ~ms: always take at least 15 (cheap), the noise of a 2-core VM is larger
      Paired p = interleaved(
          std::max(reps, 15), [&] { return b.dispatch(true) * 1e3; },
          [&] { return b.dispatch(false) * 1e3; });
      Row r = make_row(kSuite, dcase, {"ms", "ms", Better::lower}, p, "masked_loop", extra);
      r.extra["what"] =
          "the token dispatcher: route plan + permute + unpermute/combine, forward and backward, identity "
          "experts, top-k from the router given (the gate GEMM is in moe_layer_*)";
      emit(r);
    }
    if (opt.wants(lcase)) {
      b.layer(true);
      b.layer(false);
      Paired p = interleaved(reps, [&] { return b.layer(true) * 1e3; }, [&] { return b.layer(false) * 1e3; });
      Row r = make_row(kSuite, lcase, {"ms", "ms", Better::lower}, p, "masked_loop", extra);
      r.extra["what"] = "whole MoE layer (SwiGLU experts), forward and backward";
      emit(r);
    }
  }
}

// ---- full training steps of the policy model ---------------------------------------------------

policy::ModelConfig step_config(int layers, const std::string& device = "cpu") {
  policy::ModelConfig c;  // the tiny MoE of the policy bench: vocab 256, d_model 128, 8 experts top-2
  c.device = *enum_from_name<kernels::DeviceKind>(device);
  c.num_hidden_layers = layers;
  c.router_aux_loss_coef = 0.01f;
  c.cache_packed_metadata = true;
  c.activation_checkpointing = false;
  c.offload_activations = false;
  c.offload_double_buffer = true;
  c.moe_grouped = true;
  return c;
}

policy::PackedBatch make_batch(int T, int seq_len, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  policy::PackedBatch b;
  b.cu_seqlens.push_back(0);
  for (int t = 0; t < T; ++t) b.tokens.push_back(tok(rng));
  for (int start = 0; start < T; start += seq_len) b.cu_seqlens.push_back(std::min(T, start + seq_len));
  b.targets.resize(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) {
    const bool last = std::find(b.cu_seqlens.begin(), b.cu_seqlens.end(), t + 1) != b.cu_seqlens.end();
    b.targets[static_cast<size_t>(t)] = last ? -1 : b.tokens[static_cast<size_t>(t) + 1];
  }
  return b;
}

// One model + AdamW; step() = zero grads, forward_train, backward_train, AdamW (a full training step).
struct Stepper {
  policy::Model model;
  learner::AdamW opt;
  learner::OptimizerConfig ocfg;
  const policy::PackedBatch* batch;
  std::vector<float> logp, ent, dlogp;
  Stepper(policy::Model m, const policy::PackedBatch* b) : model(std::move(m)), opt(model.params().size()), batch(b) {
    const size_t T = b->tokens.size();
    logp.resize(T);
    ent.resize(T);
    dlogp.assign(T, -1.0f / static_cast<float>(T));
    ocfg.lr = 1e-4f;
  }
  Status step() {
    model.zero_grads();
    TROUPE_TRY(model.forward_train(*batch, 1.0f, logp.data(), ent.data()));
    TROUPE_TRY(model.backward_train(dlogp.data(), nullptr));
    return opt.step(model.params(), model.grads(), ocfg, ocfg.lr);
  }
  Status forward_only() { return model.forward_train(*batch, 1.0f, logp.data(), ent.data()); }
};

Result<std::unique_ptr<Stepper>> make_stepper(const policy::ModelConfig& cfg, const policy::PackedBatch* batch) {
  auto m = policy::Model::create(cfg, 7);
  if (!m.ok()) return m.error();
  return std::make_unique<Stepper>(std::move(m.value()), batch);
}

// Runs both steppers alternately; returns median step milliseconds, or an error from a step.
Result<Paired> time_steps(Stepper& ours, Stepper& base, int reps) {
  Status failed;
  auto timed = [&](Stepper& s) {
    Status st;
    double t = time_s([&] { st = s.step(); }) * 1e3;
    if (!st.ok()) failed = st;
    return t;
  };
  TROUPE_TRY(ours.step());  // warm-up: arenas, offload store, first-touch pages
  TROUPE_TRY(base.step());
  Paired p = interleaved(reps, [&] { return timed(ours); }, [&] { return timed(base); });
  if (!failed.ok()) return failed.error();
  return p;
}

// What the model-step cases on one device share: which cases run, their names (every name gets the
// prefix `pre`: "" on cpu, "cuda_" on the GPU), the repetitions, and whether any failed.
struct StepBench {
  const BenchOptions& opt;
  int reps;
  std::string pre;
  int rc = 0;

  bool want(const char* n) const { return opt.wants(pre + n); }
  std::string name(const char* n) const { return pre + n; }
  void fail(const char* n, const Error& e) {
    std::fprintf(stderr, "troupe bench kernels: %s failed: %s\n", name(n).c_str(), e.message.c_str());
    rc = 1;
  }
  // `ours` against `base` on one batch: the median step milliseconds of each, one row named `n`.
  void step_row(const char* n, const policy::ModelConfig& ours, const policy::ModelConfig& base,
                const policy::PackedBatch& batch, const char* baseline_name, const nlohmann::json& extra) {
    auto so = make_stepper(ours, &batch);
    auto sb = make_stepper(base, &batch);
    auto p = so.ok() && sb.ok() ? time_steps(**so, **sb, reps) : Result<Paired>(so.ok() ? sb.error() : so.error());
    if (!p.ok()) return fail(n, p.error());
    emit(make_row(kSuite, name(n), {"step_ms", "ms", Better::lower}, *p, baseline_name, extra));
  }
};

constexpr int kMetaLayers = 16, kOffLayers = 8, kMemLayers = 48;
// The same batches with or without --quick (which only takes fewer repetitions).
constexpr int kMetaTokens = 1024, kOffTokens = 2048;

// metadata_cache: 16 layers, many short sequences; per-layer rebuild is the baseline.
void metadata_cache_case(StepBench& b, const std::string& device) {
  policy::ModelConfig o = step_config(kMetaLayers, device), base = o;
  base.cache_packed_metadata = false;
  auto batch = make_batch(kMetaTokens, 16, o.vocab_size, 11);
  auto so = make_stepper(o, &batch);
  auto sb = make_stepper(base, &batch);
  if (!so.ok() || !sb.ok()) return b.fail("metadata_cache", so.ok() ? sb.error() : so.error());
  const uint64_t bo = (*so)->model.packed_meta_builds(), bb = (*sb)->model.packed_meta_builds();
  auto p = time_steps(**so, **sb, b.reps);
  if (!p.ok()) return b.fail("metadata_cache", p.error());
  const int steps = 1 + std::max(b.reps, 5);
  emit(make_row(kSuite, b.name("metadata_cache"), {"step_ms", "ms", Better::lower}, *p, "per_layer_rebuild",
                {{"layers", kMetaLayers},
                 {"tokens", kMetaTokens},
                 {"seq_len", 16},
                 {"meta_builds_per_step_ours", double((*so)->model.packed_meta_builds() - bo) / steps},
                 {"meta_builds_per_step_baseline", double((*sb)->model.packed_meta_builds() - bb) / steps}}));
}

// The offload cases' configs: activation checkpointing alone (ckpt), with offload and a double
// reload buffer (dbl, ours), with offload and a synchronous reload (sync); one batch for all.
struct OffloadSet {
  policy::ModelConfig ckpt, dbl, sync;
  policy::PackedBatch batch;
  nlohmann::json extra;

  explicit OffloadSet(const std::string& device) : ckpt(step_config(kOffLayers, device)) {
    ckpt.activation_checkpointing = true;
    dbl = sync = ckpt;
    dbl.offload_activations = sync.offload_activations = true;
    sync.offload_double_buffer = false;
    batch = make_batch(kOffTokens, 128, ckpt.vocab_size, 12);
    extra = {{"layers", kOffLayers}, {"tokens", kOffTokens}, {"seq_len", 128}, {"activation_checkpointing", true}};
  }
};

// offload_memory: peak activation bytes with offload vs without. Deterministic (the arena layout
// depends only on the config and batch), so one step each. Measured at 48 layers (Qwen3-30B-A3B's
// depth: checkpointed layer inputs grow with depth, the one-layer workspace does not) and, as extra
// figures, at the 8 layers of the timing cases.
void offload_memory_case(StepBench& b, const OffloadSet& set) {
  auto peak = [&](const policy::ModelConfig& base, int layers, size_t* reload, size_t* store) -> Result<double> {
    policy::ModelConfig c = base;
    c.num_hidden_layers = layers;
    auto s = make_stepper(c, &set.batch);
    if (!s.ok()) return s.error();
    TROUPE_TRY((*s)->step());
    if (const auto* off = (*s)->model.activation_offload()) {
      if (reload) *reload = off->reload_buffer_bytes();
      if (store) *store = off->store_bytes();
    }
    return double((*s)->model.activation_peak_bytes());
  };
  size_t reload = 0, store = 0;
  auto o32 = peak(set.dbl, kMemLayers, &reload, &store);
  auto b32 = peak(set.ckpt, kMemLayers, nullptr, nullptr);
  auto o8 = peak(set.dbl, kOffLayers, nullptr, nullptr);
  auto b8 = peak(set.ckpt, kOffLayers, nullptr, nullptr);
  if (!o32.ok() || !b32.ok() || !o8.ok() || !b8.ok())
    return b.fail("offload_memory",
                  !o32.ok() ? o32.error() : !b32.ok() ? b32.error() : !o8.ok() ? o8.error() : b8.error());
  nlohmann::json extra = set.extra;
  extra["layers"] = kMemLayers;
  extra["reload_buffer_bytes"] = reload;
  extra["offload_store_bytes"] = store;
  extra["ours_8_layers"] = *o8;
  extra["baseline_8_layers"] = *b8;
  // a byte count, not a timing: the same every repetition, so one is measured (not a median)
  extra["deterministic"] = true;
  extra["reps"] = 1;
  emit(make_row(kSuite, "offload_memory", {"bytes", "bytes", Better::lower}, {*o32, *b32}, "checkpoint_no_offload",
                extra));
}

// One layer's backward (with its recompute) without offload, free of the fixed costs (LM head,
// embedding, AdamW): the difference between L and L/2 layers, step minus forward, in seconds.
// Each of the four times is the minimum over `cal_reps` repetitions: the least-disturbed run is the
// compute time itself, while a median still carries the load of other jobs on a shared box (which
// made the calibrated bandwidth vary by 2.5x between runs).
Result<double> layer_backward_s(const OffloadSet& set, Stepper& full, int cal_reps) {
  policy::ModelConfig half = set.ckpt;
  half.num_hidden_layers = kOffLayers / 2;
  auto sh = make_stepper(half, &set.batch);
  Status st = sh.ok() ? (*sh)->step() : Status(sh.error());
  if (st.ok()) st = full.step();
  double step_full = 1e30, fwd_full = 1e30, step_half = 1e30, fwd_half = 1e30;
  for (int i = 0; i < cal_reps && st.ok(); ++i) {
    step_full = std::min(step_full, time_s([&] { st = full.step(); }));
    if (st.ok()) fwd_full = std::min(fwd_full, time_s([&] { st = full.forward_only(); }));
    if (st.ok()) step_half = std::min(step_half, time_s([&] { st = (*sh)->step(); }));
    if (st.ok()) fwd_half = std::min(fwd_half, time_s([&] { st = (*sh)->forward_only(); }));
  }
  if (!st.ok()) return st.error();
  return std::max(1e-4, ((step_full - fwd_full) - (step_half - fwd_half)) / (kOffLayers - kOffLayers / 2));
}

// offload_overlap_emulated: the CPU copy engine limited to the bandwidth at which one layer's
// reload takes one layer's backward, double buffer vs synchronous reload.
void offload_overlap_case(StepBench& b, const OffloadSet& set) {
  auto so = make_stepper(set.dbl, &set.batch);
  auto sb = make_stepper(set.sync, &set.batch);
  auto sn = make_stepper(set.ckpt, &set.batch);
  if (!so.ok() || !sb.ok() || !sn.ok())
    return b.fail("offload_overlap_emulated", !so.ok() ? so.error() : !sb.ok() ? sb.error() : sn.error());
  const int cal_reps = std::max(b.reps, 5);
  auto layer_bwd_s = layer_backward_s(set, **sn, cal_reps);
  if (!layer_bwd_s.ok()) return b.fail("offload_overlap_emulated", layer_bwd_s.error());
  const double layer_bytes = double(kOffTokens) * set.dbl.hidden_size * sizeof(float);
  const double bandwidth = layer_bytes / *layer_bwd_s;
  std::fprintf(stderr,
               "troupe bench kernels: offload_overlap_emulated: copy engine limited to %.1f MB/s "
               "(one %.2f MB reload ~ one layer backward, %.2f ms)\n",
               bandwidth / 1e6, layer_bytes / 1e6, *layer_bwd_s * 1e3);
  (*so)->model.offload_engine()->set_bandwidth(bandwidth);
  (*sb)->model.offload_engine()->set_bandwidth(bandwidth);
  auto p = time_steps(**so, **sb, b.reps);
  if (!p.ok()) return b.fail("offload_overlap_emulated", p.error());
  nlohmann::json extra = set.extra;
  extra["bandwidth_bytes_per_s"] = bandwidth;
  extra["bandwidth_mb_per_s"] = bandwidth / 1e6;
  extra["calibration_reps"] = cal_reps;
  extra["layer_input_bytes"] = layer_bytes;
  extra["layer_backward_ms"] = *layer_bwd_s * 1e3;
  emit(make_row(kSuite, "offload_overlap_emulated", {"step_ms", "ms", Better::lower}, *p, "offload_sync_reload",
                extra));
}

// The model-step cases on `device`. The copy-engine cases (offload_memory, offload_overlap_emulated)
// are the CPU engine's own.
int step_cases(const BenchOptions& opt, int reps, const std::string& device, const std::string& pre) {
  StepBench b{opt, reps, pre};
  const bool cpu = device == "cpu";
  if (b.want("metadata_cache")) metadata_cache_case(b, device);
  const OffloadSet set(device);
  if (b.want("offload_double_vs_sync"))
    b.step_row("offload_double_vs_sync", set.dbl, set.sync, set.batch, "offload_sync_reload", set.extra);
  if (b.want("offload_double_vs_none"))
    b.step_row("offload_double_vs_none", set.dbl, set.ckpt, set.batch, "checkpoint_no_offload", set.extra);
  if (cpu && b.want("offload_memory")) offload_memory_case(b, set);
  if (cpu && b.want("offload_overlap_emulated")) offload_overlap_case(b, set);
  if (b.want("all_vs_none")) {
    // All three on vs all three off (per-layer metadata, masked loop, offload with synchronous reload).
    policy::ModelConfig on = set.dbl, off = set.sync;
    off.cache_packed_metadata = false;
    off.moe_grouped = false;
    auto short_batch = make_batch(kOffTokens, 32, on.vocab_size, 13);
    nlohmann::json extra = set.extra;
    extra["seq_len"] = 32;
    b.step_row("all_vs_none", on, off, short_batch, "none", extra);
  }
  return b.rc;
}

// cuda_moe_grouped_vs_{streams,per_expert}_e{E}: one MoE layer's forward + backward on the GPU
// with the experts' GEMMs as one grouped-batched cuBLAS call per phase (ours) against the same GEMMs
// spread over side streams, or issued one per expert (expert_gemm.h). The layer of moe_layer_*
// (8192 tokens, top-2, d_model 128, expert hidden 128) and one at a real model's width (2048
// tokens, d_model 1024, expert hidden 512): small GEMMs, where launching them is what costs.
struct CudaMoeShape {
  const char* name;
  int E, N, C, H;
};
constexpr CudaMoeShape kCudaMoeShapes[] = {
    {"e8", 8, 8192, 128, 128}, {"e64", 64, 8192, 128, 128}, {"e64_wide", 64, 2048, 1024, 512}};

std::string cuda_moe_case(kernels::ExpertGemm baseline, const CudaMoeShape& sh) {
  return "cuda_moe_grouped_vs_" + std::string(kernels::expert_gemm_name(baseline)) + "_" + sh.name;
}

std::vector<std::string> cuda_moe_cases() {
  std::vector<std::string> v;
  for (const CudaMoeShape& sh : kCudaMoeShapes)
    for (auto base : {kernels::ExpertGemm::streams, kernels::ExpertGemm::per_expert})
      v.push_back(cuda_moe_case(base, sh));
  return v;
}

int cuda_moe_expert_gemm_cases(const BenchOptions& opt, int reps, const kernels::Backend& gpu) {
  int rc = 0;
  for (const CudaMoeShape& sh : kCudaMoeShapes) {
    const std::string vs_streams = cuda_moe_case(kernels::ExpertGemm::streams, sh);
    const std::string vs_each = cuda_moe_case(kernels::ExpertGemm::per_expert, sh);
    if (!opt.wants(vs_streams) && !opt.wants(vs_each)) continue;
    MoeBench b(sh.E, sh.N, sh.C, sh.H);
    std::vector<kernels::Buffer> bufs;
    auto up = [&](const std::vector<float>& h) -> float* {
      auto buf = gpu.alloc(sizeof(float) * h.size());
      if (!buf.ok()) return nullptr;
      gpu.copy_host_to_device(buf->data(), h.data(), sizeof(float) * h.size());
      bufs.push_back(std::move(*buf));
      return bufs.back().floats();
    };
    float *x = up(b.x), *wr = up(b.wr), *wg = up(b.wg), *wu = up(b.wu), *wd = up(b.wd), *dout = up(b.dout),
          *out = up(b.out), *dinp = up(b.dinp), *dwr = up(b.dwr), *dwg = up(b.dwg), *dwu = up(b.dwu),
          *dwd = up(b.dwd);
    float* saved = up(std::vector<float>(gpu.moe_saved_floats(b.cfg, sh.N)));
    float* scratch = up(std::vector<float>(gpu.moe_scratch_floats(b.cfg, sh.N)));
    if (!x || !wr || !wg || !wu || !wd || !dout || !out || !dinp || !dwr || !dwg || !dwu || !dwd || !saved ||
        !scratch) {
      std::fprintf(stderr, "troupe bench kernels: %s: out of GPU memory\n", vs_streams.c_str());
      rc = 1;
      continue;
    }
    const kernels::MoeWeights w{wr, wg, wu, wd, nullptr, nullptr, nullptr, {}};
    const kernels::MoeGrads g{dwr, dwg, dwu, dwd, nullptr, nullptr, nullptr, {}};
    auto layer_ms = [&](kernels::ExpertGemm mode) {
      kernels::set_expert_gemm(mode);
      return time_s([&] {
               gpu.moe_forward(out, saved, nullptr, x, w, b.cfg, sh.N, scratch, nullptr);
               gpu.moe_backward(dinp, g, dout, 0.0f, x, saved, w, b.cfg, sh.N, scratch);
               gpu.synchronize();
             }) *
             1e3;
    };
    for (auto m : {kernels::ExpertGemm::grouped, kernels::ExpertGemm::streams, kernels::ExpertGemm::per_expert})
      layer_ms(m);  // warm-up: cuBLAS heuristics, side streams, the pointer array
    const nlohmann::json extra = {{"tokens", sh.N}, {"top_k", 2}, {"experts", sh.E}, {"d_model", sh.C},
                                  {"expert_hidden", sh.H}, {"gemms_per_layer", 9 * sh.E}};
    for (auto [name, base] : {std::pair{vs_streams, kernels::ExpertGemm::streams},
                              std::pair{vs_each, kernels::ExpertGemm::per_expert}}) {
      if (!opt.wants(name)) continue;
      Paired p = interleaved(std::max(reps, 15), [&] { return layer_ms(kernels::ExpertGemm::grouped); },
                             [&, base = base] { return layer_ms(base); });
      emit(make_row(kSuite, name, {"ms", "ms", Better::lower}, p, std::string(kernels::expert_gemm_name(base)),
                    extra));
    }
    kernels::set_expert_gemm(kernels::ExpertGemm::grouped);
  }
  return rc;
}

}  // namespace

int run_kernels_suite(const BenchOptions& opt) {
  const int reps = opt.quick ? 5 : std::max(opt.reps, 9);
  moe_cases(opt, reps);
  quant_gemv_cases(opt, reps);
  int rc = step_cases(opt, reps, "cpu", "");
  // cuda_*: the same training steps (each optimization on vs off) on the GPU, when there is one.
  auto gpu = kernels::backend_for("cuda");
  if (gpu.ok()) return step_cases(opt, reps, "cuda", "cuda_") | cuda_moe_expert_gemm_cases(opt, reps, **gpu) | rc;
  std::vector<std::string> gpu_cases = {"cuda_metadata_cache", "cuda_offload_double_vs_sync",
                                        "cuda_offload_double_vs_none", "cuda_all_vs_none"};
  for (const std::string& c : cuda_moe_cases()) gpu_cases.push_back(c);
  for (const std::string& c : gpu_cases)
    if (opt.wants(c)) skip_baseline(kSuite, c, gpu.error().message);
  return rc;
}

}  // namespace troupe::bench
