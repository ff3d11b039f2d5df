// The process-wide way of issuing the MoE experts' GEMMs (troupe/kernels/expert_gemm.h).
#include "troupe/kernels/expert_gemm.h"

#include <atomic>

namespace troupe::kernels {

namespace {
std::atomic<ExpertGemm> mode{ExpertGemm::grouped};
}  // namespace

ExpertGemm expert_gemm() { return mode.load(std::memory_order_relaxed); }
void set_expert_gemm(ExpertGemm m) { mode.store(m, std::memory_order_relaxed); }

std::string_view expert_gemm_name(ExpertGemm m) {
  switch (m) {
    case ExpertGemm::grouped: return "grouped";
    case ExpertGemm::streams: return "streams";
    case ExpertGemm::per_expert: return "per_expert";
  }
  return "?";
}

std::optional<ExpertGemm> parse_expert_gemm(std::string_view name) {
  for (ExpertGemm m : {ExpertGemm::grouped, ExpertGemm::streams, ExpertGemm::per_expert})
    if (expert_gemm_name(m) == name) return m;
  return std::nullopt;
}

}  // namespace troupe::kernels
