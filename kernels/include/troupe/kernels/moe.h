// The MoE feed-forward layer as one forward/backward pair: route -> permute -> expert compute ->
// unpermute -> combine (STYLE.md point 4). Two paths with identical results: grouped (counting sort
// by expert, contiguous per-expert segments, one GEMM per segment) and the masked loop (for each
// expert, scan all assignments). Parameter gradients are ACCUMULATED (+=); dinp is ASSIGNED.
// N = tokens, C = channels, H = expert hidden size, E = experts, K = experts per token.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::kernels {

struct MoeConfig {
  int C = 0;                  // model width
  int H = 0;                  // hidden size of each routed expert's SwiGLU
  int E = 0;                  // routed experts
  int K = 0;                  // experts per token (top-k)
  bool renormalize = true;    // renormalize the top-k softmax weights to sum to 1 (Mixtral: yes; Qwen3: norm_topk_prob)
  int H_shared = 0;           // hidden size of the optional shared expert (0 = none); its output is added unweighted
  bool grouped = true;        // grouped routing (fast path) vs masked loop (baseline); results must be identical
};

// Weights in the Hugging Face layout (row-major, out x in), per expert contiguous.
struct MoeWeights {
  const float* w_router = nullptr;   // (E, C)
  const float* w_gate = nullptr;     // (E, H, C)  experts.*.w1 / gate_proj
  const float* w_up = nullptr;       // (E, H, C)  experts.*.w3 / up_proj
  const float* w_down = nullptr;     // (E, C, H)  experts.*.w2 / down_proj
  const float* ws_gate = nullptr;    // (H_shared, C) shared expert, or null
  const float* ws_up = nullptr;      // (H_shared, C)
  const float* ws_down = nullptr;    // (C, H_shared)
};

// Parameter gradients, same shapes as MoeWeights, accumulated (+=).
struct MoeGrads {
  float* w_router = nullptr;
  float* w_gate = nullptr;
  float* w_up = nullptr;
  float* w_down = nullptr;
  float* ws_gate = nullptr;
  float* ws_up = nullptr;
  float* ws_down = nullptr;
};

// What forward saves for backward: one caller-owned buffer of moe_saved_floats(cfg, N) floats
// (it lives in the model's activation arena; recompute under checkpointing fills it again).
size_t moe_saved_floats(const MoeConfig& cfg, int N);
// Scratch used inside one forward or backward call (not kept between them).
size_t moe_scratch_floats(const MoeConfig& cfg, int N);

// Router statistics of the last forward, for the load-balancing loss and metrics.
struct MoeStats {
  float aux_loss = 0;      // Switch/Mixtral load-balancing loss: E * sum_e f_e * P_e (f_e: fraction of
                           // top-k assignments to e, P_e: mean router probability of e)
  int max_expert_load = 0; // most (token, expert) assignments on one expert
  int empty_experts = 0;
};

// out (N, C) assigned. saved: moe_saved_floats; scratch: moe_scratch_floats.
void moe_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                 const MoeConfig& cfg, int N, float* scratch);
// dinp (N, C) assigned; grads accumulated. daux: d(loss)/d(aux_loss) (0 when no aux loss is used).
void moe_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                  const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch);

}  // namespace troupe::kernels
