// `troupe bench learner`: grpo_loss_fused (loss + gradients in one pass vs the same loss composed
// from separate ops) and allreduce_2ranks (the learner's flat-gradient reduction vs a raw
// MPI_Allreduce of the same buffer; the suite starts `mpirun -np 2` on a helper binary itself), and the
// sharded learners (zero1/zero2/zero3_step_2ranks, zero2/zero3_state_bytes_4ranks, zero3_device_arena_bytes_4ranks)
// against plain data parallelism,
// and expert parallelism (ep_moe_layer_2ranks) against the unsplit MoE layer, and the learners' state with
// the experts divided (ep_state_bytes_2ranks) against data parallelism.
#include <stdio.h>
#include <sys/wait.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "child_process.h"
#include "troupe/bench/bench.h"
#include "troupe/base/build_config.h"
#include "troupe/learner/loss.h"

namespace troupe::bench {

namespace {

struct LossInputs {
  int T = 0, S = 0;
  std::vector<int32_t> cu;
  std::vector<float> mask, logp, old, ref, adv, ent, dlogp, dent;
};

LossInputs make_inputs(int S, int L) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(0, 1);
  std::normal_distribution<float> nd(0, 1);
  LossInputs in;
  in.S = S;
  in.cu.push_back(0);
  for (int s = 0; s < S; ++s) {
    const int len = L / 2 + static_cast<int>(u(rng) * L);
    const int prompt = len / 4;
    for (int t = 0; t < len; ++t) {
      in.mask.push_back(t < prompt ? 0.0f : 1.0f);
      const float lp = -3.0f * u(rng);
      in.logp.push_back(lp);
      in.old.push_back(lp + 0.1f * nd(rng));
      in.ref.push_back(lp + 0.2f * nd(rng));
      in.ent.push_back(2.0f * u(rng));
    }
    in.cu.push_back(static_cast<int32_t>(in.mask.size()));
    in.adv.push_back(nd(rng));
  }
  in.T = static_cast<int>(in.mask.size());
  in.dlogp.resize(in.T);
  in.dent.resize(in.T);
  return in;
}

// Runs `cmd` and returns its stdout (nullopt when it fails).
std::optional<std::string> run_capture(const std::string& cmd) {
  auto out = run_child(cmd);
  if (!out || out->status != 0) return std::nullopt;
  return std::move(out->text);
}

// Second row of grpo_loss_fused: PyTorch eager (TRL's padded layout, float32, 1 thread) as the
// baseline, one Python process per repetition, interleaved with ours.
int bench_grpo_loss_torch(const BenchOptions& opt, const LossInputs& in, const learner::GrpoLossConfig& cfg,
                          const std::function<double()>& ours) {
  namespace fs = std::filesystem;
  const std::string script = std::string(TROUPE_SOURCE_DIR) + "/learner/bench/grpo_loss_torch.py";
  const std::string py = python_executable();
  if (!run_capture("'" + py + "' -c 'import torch, numpy' 2>/dev/null")) {
    skip_baseline("learner", "grpo_loss_fused", "pytorch_eager: torch/numpy not importable by " + py);
    return 0;
  }
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_grpo_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  int L = 0;
  for (int s = 0; s < in.S; ++s) L = std::max(L, in.cu[s + 1] - in.cu[s]);
  auto write = [&](const char* name, const std::vector<float>& packed) {
    std::vector<float> pad(static_cast<size_t>(in.S) * L, 0.0f);
    for (int s = 0; s < in.S; ++s)
      for (int t = in.cu[s]; t < in.cu[s + 1]; ++t) pad[static_cast<size_t>(s) * L + (t - in.cu[s])] = packed[t];
    std::ofstream f(dir / (std::string(name) + ".f32"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(pad.data()), static_cast<std::streamsize>(pad.size() * sizeof(float)));
  };
  write("mask", in.mask);
  write("logp", in.logp);
  write("old", in.old);
  write("ref", in.ref);
  write("entropy", in.ent);
  {
    std::ofstream f(dir / "adv.f32", std::ios::binary);
    f.write(reinterpret_cast<const char*>(in.adv.data()), static_cast<std::streamsize>(in.adv.size() * sizeof(float)));
    std::ofstream m(dir / "meta.json");
    m << nlohmann::json{{"S", in.S}, {"L", L}, {"T", in.T}, {"clip_low", cfg.clip_low}, {"clip_high", cfg.clip_high},
                        {"kl_coef", cfg.kl_coef}, {"entropy_coef", cfg.entropy_coef}}.dump();
  }
  const std::string cmd = "OPENBLAS_NUM_THREADS=1 TROUPE_TORCH_THREADS=1 '" + py + "' '" + script + "' '" + dir.string() + "'";
  bool ok = true;
  auto torch_rep = [&]() -> double {
    auto out = run_capture(cmd);
    double v = 0;
    if (!out || std::sscanf(out->c_str(), "tokens_per_s %lf", &v) != 1) ok = false;
    return v;
  };
  Paired p = interleaved(5, ours, torch_rep);
  fs::remove_all(dir);
  if (!ok) {
    skip_baseline("learner", "grpo_loss_fused", "pytorch_eager: `" + cmd + "` failed");
    return 0;
  }
  emit(make_row("learner", "grpo_loss_fused", {"tokens_per_s", "tokens/s", Better::higher}, p,
                "pytorch_eager",
                {{"tokens", in.T}, {"padded_tokens", in.S * L}, {"sequences", in.S}, {"threads", 1}}));
  return 0;
}

int bench_grpo_loss(const BenchOptions& opt) {
  using namespace troupe::learner;
  const int S = opt.quick ? 128 : 512, L = 512;
  LossInputs in = make_inputs(S, L);
  GrpoLossConfig cfg;  // a typical DAPO/GRPO setting: clip-higher, k3 KL, entropy bonus, token-mean
  cfg.clip_high = 0.28f;
  cfg.kl_coef = 0.04f;
  cfg.entropy_coef = 0.01f;
  cfg.kl_input_clamp = cfg.kl_output_clamp = 0;  // no KL clamps, as the PyTorch baseline (TRL)
  TokenBatch b{in.T, in.S, in.cu.data(), in.mask.data(), in.old.data(), in.ref.data(), in.adv.data()};
  LossNorm norm;
  for (float m : in.mask) norm.num_tokens += m;
  norm.num_seqs = S;
  bool ok = true;
  auto run = [&](bool fused) {
    return [&, fused] {
      const double s = time_s([&] {
        auto r = fused ? grpo_loss_fused(in.dlogp.data(), in.dent.data(), in.logp.data(), in.ent.data(), b, cfg, norm)
                       : grpo_loss_composed(in.dlogp.data(), in.dent.data(), in.logp.data(), in.ent.data(), b, cfg, norm);
        ok = ok && r.ok();
      });
      return in.T / s;
    };
  };
  run(true)();  // warm caches and allocations
  run(false)();
  Paired p = interleaved(opt.quick ? 5 : 11, run(true), run(false));
  if (!ok) {
    std::fprintf(stderr, "troupe bench learner: grpo loss failed\n");
    return 1;
  }
  emit(make_row("learner", "grpo_loss_fused", {"tokens_per_s", "tokens/s", Better::higher}, p, "composed_ops",
                {{"tokens", in.T}, {"sequences", S}, {"threads", 1}}));
  return bench_grpo_loss_torch(opt, in, cfg, run(true));
}

int bench_allreduce(const BenchOptions& opt) {
  const auto helper = helper_binary("troupe_learner_allreduce_bench", "learner", "allreduce_2ranks");
  if (!helper) return 1;
  const std::string cmd = mpirun_command("", 2, "", *helper, std::string("--reps ") + (opt.quick ? "31" : "61"));
  const auto out = run_child(cmd, "learner");  // (on failure the output is printed)
  if (!out) return 1;
  nlohmann::json j;
  for (const auto& line : out->objects)  // the JSON line among whatever mpirun printed
    if (line.contains("ours_ms")) j = line;
  if (out->status != 0 || j.is_null()) {
    std::fprintf(stderr, "troupe bench learner: allreduce_2ranks: `%s` failed (status %d):\n%s\n", cmd.c_str(),
                 out->status, out->text.c_str());
    return 1;
  }
  emit(make_row("learner", "allreduce_2ranks", {"ms", "ms", Better::lower},
                {j["ours_ms"].get<double>(), j["raw_ms"].get<double>()}, "raw_mpi_allreduce",
                {{"floats", j["floats"]}, {"bytes", j["floats"].get<double>() * 4}, {"ranks", 2}}));
  return 0;
}

// Expert parallelism (troupe_learner_ep_bench under mpirun -np 2): one MoE layer's forward +
// backward with its 8 experts split over 2 ranks against the unsplit layer on each rank (the same
// expert work, no all-to-all); tokens/s = both ranks' tokens over the slowest rank's time.
int bench_expert_parallel(const BenchOptions& opt) {
  const auto helper = helper_binary("troupe_learner_ep_bench", "learner", "ep_moe_layer_2ranks");
  if (!helper) return 1;
  const std::string cmd = mpirun_command("", 2, "", *helper, std::string("--reps ") + (opt.quick ? "5" : "11"));
  const auto out = run_child(cmd, "learner");
  if (!out) return 1;
  nlohmann::json j;
  for (const auto& line : out->objects)
    if (line.contains("ours_ms")) j = line;
  if (out->status != 0 || j.is_null()) {
    std::fprintf(stderr, "troupe bench learner: ep_moe_layer_2ranks: `%s` failed (status %d):\n%s\n", cmd.c_str(),
                 out->status, out->text.c_str());
    return 1;
  }
  const double tokens = 2.0 * j["tokens_per_rank"].get<double>();
  emit(make_row("learner", "ep_moe_layer_2ranks", {"tokens_per_s", "tokens/s", Better::higher},
                {tokens / (j["ours_ms"].get<double>() / 1e3), tokens / (j["unsplit_ms"].get<double>() / 1e3)},
                "unsplit_layer_each_rank_all_experts",
                {{"ranks", 2}, {"tokens_per_rank", j["tokens_per_rank"]}, {"alltoall_bytes", j["alltoall_bytes"]},
                 {"C", j["C"]}, {"H", j["H"]}, {"E", j["E"]}, {"K", j["K"]}}));
  return 0;
}

// Expert parallelism that divides memory (troupe_learner_ep_state_bench under mpirun -np 2): the
// largest learner's training state (parameters, gradients, AdamW moments) with the experts divided
// over 2 ranks against data parallelism, a small Qwen3-MoE shape (2 layers, 16 experts); the GRPO
// step times of both beside it, and learner 0's figure in `troupe run` terms (its state and what
// its weight sync keeps, the `learner0_*` fields).
int bench_expert_parallel_state(const BenchOptions& opt) {
  const auto helper = helper_binary("troupe_learner_ep_state_bench", "learner", "ep_state_bytes_2ranks");
  if (!helper) return 1;
  const std::string cmd = mpirun_command("", 2, "", *helper, std::string("--reps ") + (opt.quick ? "3" : "5"));
  const auto out = run_child(cmd, "learner");
  if (!out) return 1;
  nlohmann::json j;
  for (const auto& line : out->objects)
    if (line.contains("ours_state_bytes")) j = line;
  if (out->status != 0 || j.is_null()) {
    std::fprintf(stderr, "troupe bench learner: ep_state_bytes_2ranks: `%s` failed (status %d):\n%s\n", cmd.c_str(),
                 out->status, out->text.c_str());
    return 1;
  }
  const double ours = j["ours_state_bytes"].get<double>(), dp = j["dp_state_bytes"].get<double>();
  emit(make_row("learner", "ep_state_bytes_2ranks", {"state_bytes", "bytes", Better::lower}, {ours, dp}, "data_parallel",
                {{"ranks", 2},
                 {"params", j["params"]},
                 {"routed_params", j["routed_params"]},
                 {"ratio", ours / dp},
                 {"learner0_sync_bytes", j["learner0_sync_bytes"]},
                 {"learner0_dp_sync_bytes", j["learner0_dp_sync_bytes"]},
                 {"learner0_bytes", j["learner0_bytes"]},
                 {"learner0_dp_bytes", j["learner0_dp_bytes"]},
                 {"learner0_ratio", j["learner0_bytes"].get<double>() / j["learner0_dp_bytes"].get<double>()},
                 {"tokens_per_rank", j["tokens_per_rank"]},
                 {"ours_step_ms", j["ours_ms"]},
                 {"dp_step_ms", j["dp_ms"]},
                 {"shape", "qwen3_moe 2 layers, 16 experts, C 512, H 256, V 8192"}}));
  return 0;
}

// The sharded learners against plain data parallelism (troupe_learner_shard_bench under mpirun):
// a GRPO step of SmolLM2-135M's shape cut to 2 layers (its 49152 x 576 embedding and head kept), 4 x 64
// tokens per rank (--quick: 1 layer, 4 x 32); SmolLM2's 30 layers and 4 x 256 tokens took minutes a
// step on 2 shared cores. The figures on the row say which shape ran.
// device: both models on cpu_fenced, the row ZeRO-3's sparse device arena against data parallelism's.
int bench_shard(const BenchOptions& opt, const std::string& case_name, const std::string& stage, int ranks,
                bool state_only, bool device = false) {
  const auto helper = helper_binary("troupe_learner_shard_bench", "learner", case_name);
  if (!helper) return 1;
  // (the device row: 8 layers, so that the tied 49152 x 576 embedding, which a step holds whole, is
  // half the model rather than four fifths)
  const int layers = device ? (opt.quick ? 2 : 8) : (opt.quick ? 1 : 2);
  const std::string args = "--stage " + stage + " --layers " + std::to_string(layers) + " --seqs 4 --seq-len " +
                           (opt.quick ? "32" : "64") + " --reps " + (opt.quick ? "3" : "5") +
                           (state_only ? " --state-only" : "") + (device ? " --device cpu_fenced" : "");
  const std::string cmd = mpirun_command("", ranks, "", *helper, args);
  const auto out = run_child(cmd, "learner");
  if (!out) return 1;
  nlohmann::json j, dev;
  for (const auto& line : out->objects) {
    if (line.contains("ours_ms")) j = line;
    if (line.contains("ours_device_peak_bytes")) dev = line;
  }
  if (device && dev.is_null()) j = nullptr;  // (the device figures are the row's)
  if (out->status != 0 || j.is_null()) {
    std::fprintf(stderr, "troupe bench learner: %s: `%s` failed (status %d):\n%s\n", case_name.c_str(), cmd.c_str(),
                 out->status, out->text.c_str());
    return 1;
  }
  nlohmann::json extra = {{"stage", stage},
                                {"ranks", ranks},
                                {"params", j["params"]},
                                {"layers", layers},
                                {"shape", "smollm2_135m"},
                                {"tokens_per_rank", j["tokens_per_rank"]},
                                {"dp_state_bytes", j["dp_state_bytes"]},
                                {"ours_state_bytes", j["ours_state_bytes"]}};
  if (stage == "parameters" && !state_only && !device) extra["no_prefetch_ms"] = j["no_prefetch_ms"];
  if (device) {
    extra["device"] = "cpu_fenced";
    extra["ours_step_ms"] = j["ours_ms"];
    extra["dp_step_ms"] = j["dp_ms"];
    extra["ours_device_rest_bytes"] = dev["ours_device_rest_bytes"];
    emit(make_row("learner", case_name, {"device_arena_bytes", "bytes", Better::lower},
                  {dev["ours_device_peak_bytes"].get<double>(), dev["dp_device_bytes"].get<double>()}, "data_parallel",
                  extra));
  } else if (state_only)
    emit(make_row("learner", case_name, {"state_bytes", "bytes", Better::lower},
                  {j["ours_state_bytes"].get<double>(), j["dp_state_bytes"].get<double>()}, "data_parallel", extra));
  else
    emit(make_row("learner", case_name, {"step_ms", "ms", Better::lower},
                  {j["ours_ms"].get<double>(), j["dp_ms"].get<double>()}, "data_parallel", extra));
  return 0;
}

}  // namespace

int run_learner_suite(const BenchOptions& opt) {
  int rc = 0;
  if (opt.wants("grpo_loss_fused")) rc |= bench_grpo_loss(opt);
  if (opt.wants("allreduce_2ranks")) rc |= bench_allreduce(opt);
  if (opt.wants("zero1_step_2ranks")) rc |= bench_shard(opt, "zero1_step_2ranks", "optimizer", 2, false);
  if (opt.wants("zero2_step_2ranks")) rc |= bench_shard(opt, "zero2_step_2ranks", "gradients", 2, false);
  if (opt.wants("zero2_state_bytes_4ranks")) rc |= bench_shard(opt, "zero2_state_bytes_4ranks", "gradients", 4, true);
  if (opt.wants("zero3_step_2ranks")) rc |= bench_shard(opt, "zero3_step_2ranks", "parameters", 2, false);
  if (opt.wants("zero3_state_bytes_4ranks")) rc |= bench_shard(opt, "zero3_state_bytes_4ranks", "parameters", 4, true);
  if (opt.wants("zero3_device_arena_bytes_4ranks"))
    rc |= bench_shard(opt, "zero3_device_arena_bytes_4ranks", "parameters", 4, false, true);
  if (opt.wants("ep_moe_layer_2ranks")) rc |= bench_expert_parallel(opt);
  if (opt.wants("ep_state_bytes_2ranks")) rc |= bench_expert_parallel_state(opt);
  return rc;
}

}  // namespace troupe::bench
