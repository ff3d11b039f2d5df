// How a device backend runs the MoE experts' GEMMs: the routed tokens are sorted by expert into
// contiguous segments (moe.h, grouped routing), and each phase of the expert MLP is then one GEMM
// per non-empty segment, all independent of each other. Three ways to issue them:
//   grouped     one cuBLAS grouped-batched GEMM per phase (cublasSgemmGroupedBatched: every
//               segment's GEMM in one launch, each its own size) -- the default;
//   streams     one GEMM per segment, spread round-robin over side streams that fork from and
//               join the backend's queue through events;
//   per_expert  one GEMM per segment on the queue, one after the other.
// Results are equal up to the GEMM kernels cuBLAS picks. A process-wide setting, read at every MoE
// layer call; `troupe bench kernels` compares them on a GPU (rows cuda_moe_grouped_vs_*). The CPU
// backends run their own per-segment loop and ignore it. With policy.compute_dtype bf16 the CUDA
// backend issues per_expert GEMMs whatever the setting (the bf16 operand copies share one workspace).
#pragma once

#include <optional>
#include <string_view>

namespace troupe::kernels {

enum class ExpertGemm { grouped, streams, per_expert };

ExpertGemm expert_gemm();
void set_expert_gemm(ExpertGemm mode);

std::string_view expert_gemm_name(ExpertGemm mode);
std::optional<ExpertGemm> parse_expert_gemm(std::string_view name);

}  // namespace troupe::kernels
