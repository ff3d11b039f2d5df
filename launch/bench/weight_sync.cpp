// `troupe bench weight_sync`: learner 0's weights to 1 and to 3 generator ranks after one AdamW
// step at lr 1e-6, through troupe's real weight-sync path (Weights messages over ZeroMQ tcp,
// decoded and checksummed by each generator, acknowledged), as a delta and in full, against a raw
// MPI_Bcast of the generators' full buffer among the same ranks. The suite starts
// `mpirun -np 4 --mca btl self,tcp` (a network stack, not shared memory) on the helper
// troupe_weight_sync_bench (weight_sync_ranks.cpp) once per generator dtype: bf16 rows
// delta_1gen, delta_3gen, full_1gen, full_3gen, and the same with the suffix _fp32. Metric
// seconds per sync (lower is better; ratio = MPI_Bcast / ours); extra fields bytes_sent (Weights
// payload summed over the generators), baseline_bytes (the buffer times the generators) and their
// ratio, changed_frac (values the step changed in the generators' dtype), step_s (the learner's
// train step, which with bf16 includes preparing the delta) and prepared (the share of delta
// syncs that took the delta prepared in the step). The model is
// SmolLM2-135M's shape (random init); --quick: the same widths with 6 layers and a 16384 vocab
// (the row's "model" says which). lora_sync_1gen runs the helper with rank-16 adapters (--lora 16):
// the bytes of a full sync that carries the adapters alone (compressed, as a LoRA run's learner
// sends them) against a full bf16 sync of the model. The relay rows run the helper with --relay 2
// under mpirun -np 8 (7 generator ranks, bf16 deltas): relay_delta_7gen, rank 0's egress bytes per
// delta sync with weight_sync.relay_fanout 2 against the star (fan-out 0: one copy per generator);
// relay_delta_7gen_1gbps, the seconds per delta sync of both with every rank's link limited to
// 1 Gbit/s each way (TROUPE_BENCH_LINK_BYTES_PER_S: a benchmark-only pacing in the runtime's transport).
#include <cstdio>
#include <algorithm>
#include <string>

#include "child_process.h"
#include "smollm2_shape.h"
#include "troupe/bench/bench.h"

namespace troupe::bench {

namespace {

constexpr const char* kSuite = "weight_sync";

int run_dtype(const BenchOptions& opt, const std::string& dtype) {
  const std::string suffix = dtype == "bf16" ? "" : "_" + dtype;
  bool wanted = false;
  for (const char* c : {"delta_1gen", "delta_3gen", "full_1gen", "full_3gen"})
    wanted = wanted || opt.wants(std::string(c) + suffix);
  if (!wanted) return 0;
  const auto helper = helper_binary("troupe_weight_sync_bench", kSuite, "delta_1gen" + suffix);
  if (!helper) return 1;
  const std::string cmd = mpirun_command(
      "OMP_WAIT_POLICY=PASSIVE ", 4, " --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo",
      *helper, "--dtype " + dtype + " --reps " + std::to_string(std::max(5, opt.reps)) + (opt.quick ? " --quick" : ""));
  const auto out = run_child(cmd, "weight_sync");
  if (!out) return 1;
  int rows = 0;
  for (const auto& j : out->objects) {  // the JSON lines among whatever mpirun printed
    if (!j.contains("weight_sync_case")) continue;
    const std::string name = j["weight_sync_case"].get<std::string>() + suffix;
    if (!opt.wants(name)) continue;
    const double bytes = j["bytes_sent"].get<double>(), base_bytes = j["baseline_bytes"].get<double>();
    nlohmann::json extra = {{"bytes_sent", bytes},
                            {"baseline_bytes", base_bytes},
                            {"bytes_ratio", bytes > 0 ? base_bytes / bytes : 0.0},
                            {"changed_frac", j["changed_frac"]},
                            {"dtype", dtype},
                            {"generators", j["generators"]},
                            {"params", j["params"]},
                            {"model", std::string(opt.quick ? "SmolLM2-135M widths, 6 layers, vocab 16384 (--quick)"
                                                            : "SmolLM2-135M shape")},
                            {"update", "one AdamW step, lr 1e-6"},
                            {"transport", "troupe runtime over ZeroMQ tcp (127.0.0.1)"},
                            {"baseline_transport", "MPI_Bcast, --mca btl self,tcp"},
                            {"probe", j.value("probe", false)},
                            // the learner's train step (forward, backward, AdamW); with bf16 it
                            // includes preparing the delta (weight_sync.prepare_in_step)
                            {"step_s", j["step_s"]},
                            {"prepared", j["prepared"]},
                            {"reps", j["reps"]},
                            {"threads_per_rank", j["threads_per_rank"]}};
    emit(make_row(kSuite, name, {"seconds", "s", Better::lower}, {j["ours"].get<double>(), j["baseline"].get<double>()},
                  "mpi_bcast", extra));
    ++rows;
  }
  if (out->status != 0 || rows == 0) {
    std::fprintf(stderr, "troupe bench weight_sync: `%s` failed (status %d):\n%s\n", cmd.c_str(), out->status,
                 out->text.c_str());
    return 1;
  }
  return 0;
}

// Parameters of the model the helper syncs (SmolLM2-135M's shape; --quick: 6 layers, vocab 16384).
double smollm2_params(bool quick) {
  policy::ModelArchitecture a = smollm2_135m_architecture();
  if (quick) a.vocab_size = 16384, a.num_hidden_layers = 6;
  const double C = a.hidden_size, QD = a.num_attention_heads * a.head_dim, KD = a.num_key_value_heads * a.head_dim;
  const double layer = 2 * C + C * QD + 2 * C * KD + QD * C + 3 * C * a.intermediate_size;
  return a.vocab_size * C + a.num_hidden_layers * layer + C;  // tied embeddings
}

// lora_sync_1gen: the helper with rank-16 adapters on every linear layer (bf16 generators): a full
// sync then carries the adapters alone, compressed (the delta against zeros, zstd level 3). ours =
// its bytes, baseline = a full bf16 sync of the whole model (2 bytes per parameter), so ratio =
// full bf16 bytes / full adapter sync bytes; delta_bytes is a delta's after one more step.
int run_lora(const BenchOptions& opt) {
  constexpr const char* kCase = "lora_sync_1gen";
  if (!opt.wants(kCase)) return 0;
  const auto helper = helper_binary("troupe_weight_sync_bench", kSuite, kCase);
  if (!helper) return 1;
  const std::string cmd = mpirun_command(
      "OMP_WAIT_POLICY=PASSIVE ", 4, " --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo",
      *helper, std::string("--dtype bf16 --lora 16 --reps 5") + (opt.quick ? " --quick" : ""));
  const auto out = run_child(cmd, "weight_sync");
  if (!out) return 1;
  nlohmann::json full, delta;
  for (const auto& j : out->objects) {
    if (!j.contains("weight_sync_case")) continue;
    if (j["weight_sync_case"] == "full_1gen") full = j;
    if (j["weight_sync_case"] == "delta_1gen") delta = j;
  }
  if (out->status != 0 || full.is_null() || delta.is_null()) {
    std::fprintf(stderr, "troupe bench weight_sync: `%s` failed (status %d):\n%s\n", cmd.c_str(), out->status,
                 out->text.c_str());
    return 1;
  }
  const double model_params = smollm2_params(opt.quick);
  nlohmann::json extra = {{"adapter_params", full["params"]},
                          {"model_params", model_params},
                          {"full_sync_s", full["ours"]},
                          {"delta_sync_s", delta["ours"]},
                          {"delta_bytes", delta["bytes_sent"]},
                          {"rank", 16},
                          {"targets", "all_linear"},
                          {"dtype", "bf16"},
                          {"model", std::string(opt.quick ? "SmolLM2-135M widths, 6 layers, vocab 16384 (--quick)"
                                                          : "SmolLM2-135M shape")},
                          {"transport", "troupe runtime over ZeroMQ tcp (127.0.0.1)"},
                          {"reps", full["reps"]}};
  emit(make_row(kSuite, kCase, {"bytes_sent", "B", Better::lower},
                {full["bytes_sent"].get<double>(), 2.0 * model_params}, "full_bf16_sync", extra));
  return 0;
}

// One helper run with --relay 2 (and --gbps when given): its JSON line, or null.
nlohmann::json run_relay_helper(const BenchOptions& opt, const std::string& helper, double gbps) {
  const std::string cmd = mpirun_command(
      "OMP_WAIT_POLICY=PASSIVE ", 8, " --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo",
      helper, "--dtype bf16 --relay 2 --reps " + std::to_string(std::max(5, opt.reps)) +
                  (gbps > 0 ? " --gbps " + std::to_string(gbps) : std::string()) + (opt.quick ? " --quick" : ""));
  const auto out = run_child(cmd, "weight_sync");
  if (!out) return nullptr;
  for (const auto& j : out->objects)
    if (j.contains("weight_sync_case") && j["weight_sync_case"] == "relay" && out->status == 0) return j;
  std::fprintf(stderr, "troupe bench weight_sync: `%s` failed (status %d):\n%s\n", cmd.c_str(), out->status,
               out->text.c_str());
  return nullptr;
}

nlohmann::json relay_extra(const BenchOptions& opt, const nlohmann::json& j) {
  return {{"star", j["star"]},
          {"tree", j["tree"]},
          {"fanout", j["fanout"]},
          {"gbps", j["gbps"]},
          {"generators", j["generators"]},
          {"params", j["params"]},
          {"dtype", "bf16"},
          {"model", std::string(opt.quick ? "SmolLM2-135M widths, 6 layers, vocab 16384 (--quick)" : "SmolLM2-135M shape")},
          {"update", "one AdamW step, lr 1e-6"},
          {"transport", "troupe runtime over ZeroMQ tcp (127.0.0.1), one rank per generator"},
          {"reps", j["reps"]}};
}

// relay_delta_7gen and relay_delta_7gen_1gbps (see the file comment).
int run_relay(const BenchOptions& opt) {
  const bool bytes_row = opt.wants("relay_delta_7gen"), time_row = opt.wants("relay_delta_7gen_1gbps");
  if (!bytes_row && !time_row) return 0;
  const auto helper = helper_binary("troupe_weight_sync_bench", kSuite, "relay_delta_7gen");
  if (!helper) return 1;
  if (bytes_row) {
    const auto j = run_relay_helper(opt, *helper, 0);
    if (j.is_null()) return 1;
    emit(make_row(kSuite, "relay_delta_7gen", {"egress_bytes", "B", Better::lower},
                  {j["tree"]["egress_bytes"].get<double>(), j["star"]["egress_bytes"].get<double>()}, "star",
                  relay_extra(opt, j)));
  }
  if (time_row) {
    const auto j = run_relay_helper(opt, *helper, 1.0);
    if (j.is_null()) return 1;
    emit(make_row(kSuite, "relay_delta_7gen_1gbps", {"seconds", "s", Better::lower},
                  {j["tree"]["seconds"].get<double>(), j["star"]["seconds"].get<double>()}, "star", relay_extra(opt, j)));
  }
  return 0;
}

}  // namespace

int run_weight_sync_suite(const BenchOptions& opt) {
  int rc = 0;
  for (const char* dtype : {"bf16", "fp32"}) rc |= run_dtype(opt, dtype);
  return rc | run_lora(opt) | run_relay(opt);
}

}  // namespace troupe::bench
