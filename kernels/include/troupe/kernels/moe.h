// The MoE feed-forward layer as one forward/backward pair: route -> permute -> expert compute ->
// unpermute -> combine. Two paths with identical results: grouped (counting sort
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

// LoRA adapters on the routed experts (policy.lora targets: experts), PEFT's layout: per expert
// A (r, in), B (out, r) of gate (C -> H), up (C -> H) and down (H -> C), expert e's at the
// pointers + e * stride. The expert FFN becomes g = x Wg^T + s (x Ag^T) Bg^T, u likewise,
// y = h Wd^T + s (h Ad^T) Bd^T. r = 0: none. Shared experts get none.
struct MoeLoraWeights {
  const float *a_gate = nullptr, *b_gate = nullptr, *a_up = nullptr, *b_up = nullptr, *a_down = nullptr,
              *b_down = nullptr;
  size_t stride = 0;  // floats from one expert's adapters to the next
  int r = 0;
  float scale = 0;
};
// Their gradients (accumulated), same layout.
struct MoeLoraGrads {
  float *a_gate = nullptr, *b_gate = nullptr, *a_up = nullptr, *b_up = nullptr, *a_down = nullptr,
        *b_down = nullptr;
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
  MoeLoraWeights lora;               // adapters on the routed experts (r = 0: none)
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
  MoeLoraGrads lora;  // with MoeWeights::lora.r > 0
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
// route (N, K) or null: routing replay. A token whose row holds K distinct expert ids in [0, E)
// goes to those experts instead of its router's top-k, with combine weights from its own router
// probabilities over that set (renormalized when cfg.renormalize); a row starting with -1 routes
// as usual. The choice is saved with the rest, so moe_backward differentiates the same routing
// (gradients reach the router through the weights). The caller validates the ids.
void moe_forward(float* out, float* saved, MoeStats* stats, const float* inp, const MoeWeights& w,
                 const MoeConfig& cfg, int N, float* scratch, const int32_t* route = nullptr);
// dinp (N, C) assigned; grads accumulated. daux: d(loss)/d(aux_loss) (0 when no aux loss is used).
void moe_backward(float* dinp, const MoeGrads& g, const float* dout, float daux, const float* inp,
                  const float* saved, const MoeWeights& w, const MoeConfig& cfg, int N, float* scratch);

// The token dispatcher alone: route plan, permute and unpermute/combine, forward and backward, with
// identity experts (y = x), given each token's top-k -- experts (N, K), ascending per token, and
// weights (N, K). The router (gate GEMM, softmax, top-k) is left out: it is the same work in both
// paths and belongs to the whole layer. Same code path as moe_forward/moe_backward (cfg.grouped
// picks it) and same saved/scratch sizes; cfg.H_shared ignored. What the moe_dispatch_* benchmarks
// time and what tests use to check the round trip. out (N, C) assigned: out[t] = sum_k w[t,k] x[t].
void moe_dispatch_forward(float* out, float* saved, const int32_t* experts, const float* weights,
                          const float* inp, const MoeConfig& cfg, int N, float* scratch);
// dinp (N, C) assigned: sum_k w[t,k] dout[t]; dweights (N, K) assigned: <x[t], dout[t]>.
void moe_dispatch_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                           const float* saved, const MoeConfig& cfg, int N, float* scratch);

// Passes that write whole rows read only by a later pass (permute, row gather, assigning combine)
// use streaming stores once one pass writes at least this many bytes. Default: a quarter of the
// last-level cache (sysconf), at least 4 MiB. Values are the same either way; tests set it to run
// both ways (0: always when aligned, SIZE_MAX: never).
size_t moe_stream_bytes();
void set_moe_stream_bytes(size_t bytes);

// ---- Pieces of the layer, public for tests, metrics and the CUDA port --------------------------
// A token's K experts are stored in ascending expert id (not by weight), so "k order" is
// "expert order" in every reduction; this is what makes the grouped path and the masked loop
// bit-identical. A slot is s = t*K + k; a row is a position in the expert-major permuted layout.

// The routing the last moe_forward stored in `saved` (valid while `saved` is).
struct MoeRouting {
  const float* probs = nullptr;      // (N, E) softmax of the router logits
  const int32_t* experts = nullptr;  // (N, K) chosen experts, ascending per token
  const float* weights = nullptr;    // (N, K) combine weights (renormalized when cfg.renormalize)
  const int32_t* offsets = nullptr;  // (E+1) exclusive scan of per-expert counts; segment e = [offsets[e], offsets[e+1])
  const int32_t* row_slot = nullptr; // (N*K) row -> slot; tokens ascend within each segment (stable)
  const int32_t* slot_row = nullptr; // (N*K) slot -> row (inverse of row_slot)
};
MoeRouting moe_saved_routing(const float* saved, const MoeConfig& cfg, int N);

// Counting sort of the N*K assignments by expert: histogram -> exclusive scan -> stable scatter.
// counts (E) is scratch. O(N*K + E), no comparison sort.
void moe_route_plan(int32_t* offsets, int32_t* row_slot, int32_t* slot_row, int32_t* counts,
                    const int32_t* experts, int N, int K, int E);
// Permute: xp[slot_row[t*K+k]] = x[t] (equivalently xp[r] = x[row_slot[r] / K]), xp (N*K, C)
// assigned; walks the tokens, so each x row is read once. Its backward is moe_unpermute with
// weights == nullptr.
void moe_permute(float* xp, const float* x, const int32_t* slot_row, int N, int K, int C);
// Unpermute + combine: out[t] += sum_k weights[t*K+k] * yp[slot_row[t*K+k]] (k ascending), out (N, C)
// ACCUMULATED (accumulate = false: assigned, with the same bits as zeroing out first); weights ==
// nullptr means 1. Its backward w.r.t. yp is moe_permute of dout scaled by weights.
void moe_unpermute(float* out, const float* yp, const float* weights, const int32_t* slot_row, int N, int K,
                   int C, bool accumulate = true);

}  // namespace troupe::kernels
