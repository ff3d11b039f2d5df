// The buffers the expert-parallel MoE layer (moe_ep_layer.h) keeps in its executor's memory (device
// memory on cuda, host memory in the host tests), each grown by the executor (a quarter more than
// asked, never shrunk; contents not kept on growth) and freed by the `release` it set:
//   MoeEpBuffers, one per layer (MoeEpState::device): what the experts' owner keeps from forward to
//     backward, the received rows' inputs x (M, C) and gate / up pre-activations g, u (M, H);
//   MoeEpScratch, one per queue (the CUDA backend's, shared by every layer, which run one after
//     the other under its lock): the owner's scratch of one pass, h, dg (M, H), rows (the exchanged
//     rows, M by C + 1), dop (M, C: the rows' dout, then their dx), wrow, dw (M).
// M, the rows a rank receives, changes every pass. Plain C++ (nvcc and the host compiler).
#pragma once

#include <cstddef>
#include <initializer_list>

#include "troupe/kernels/moe_expert_parallel.h"

namespace troupe::kernels::cuda {

struct MoeEpPiece {
  void* data = nullptr;
  size_t bytes = 0;
  float* f() const { return static_cast<float*>(data); }
};

// Pieces freed by `release` when their holder goes.
class MoeEpPieces {
 public:
  void (*release)(void*) = nullptr;
  MoeEpPieces() = default;
  MoeEpPieces(const MoeEpPieces&) = delete;
  MoeEpPieces& operator=(const MoeEpPieces&) = delete;

 protected:
  ~MoeEpPieces() = default;
  void free_all(std::initializer_list<MoeEpPiece*> pieces) {
    for (MoeEpPiece* p : pieces)
      if (p->data && release) release(p->data), p->data = nullptr, p->bytes = 0;
  }
};

struct MoeEpBuffers final : MoeEpDeviceState, MoeEpPieces {
  MoeEpPiece x, g, u;
  bool forward_kept = false;  // x, g, u hold a forward's rows no backward has used yet
  ~MoeEpBuffers() override { free_all({&x, &g, &u}); }
};

struct MoeEpScratch final : MoeEpPieces {
  MoeEpPiece h, dg, rows, dop, wrow, dw;
  ~MoeEpScratch() { free_all({&h, &dg, &rows, &dop, &wrow, &dw}); }
};

}  // namespace troupe::kernels::cuda
