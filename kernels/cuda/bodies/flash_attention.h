// Kernel bodies of fused attention (attention.cu): FlashAttention-2 forward and backward over tiles
// of Q and K/V held in a block's shared memory, and split-K decode. Invariant: every reduction a
// row's value depends on runs sequentially in a fixed order inside one lane, so results do not
// depend on the block's lane count; masked scores give exactly p = 0 (causal, own sequence only).
#pragma once

#include "attention.h"

namespace troupe::kernels::cuda {

// Threads per block of the tile kernels; the host test also runs other lane counts.
inline constexpr int kFlashThreads = 128;
// Most shared memory a tile block may ask for (sm_80 allows 163 KiB per block, sm_90 227 KiB).
inline constexpr size_t kFlashMaxSharedBytes = 160 * 1024;
// Keys per split of the decode kernel (flash-decoding).
inline constexpr int kDecodeSplit = 64;

// Shared floats of each tile body for square tiles of `b` rows and head size HD (the largest is the
// dK/dV body: K, V, dK, dV, Q, dO tiles, the P/dS tile and per-row lse, D, sequence start).
TROUPE_HD inline size_t flash_forward_floats(int b, int HD) {
  return 4 * static_cast<size_t>(b) * HD + static_cast<size_t>(b) * b + 4 * static_cast<size_t>(b);
}
TROUPE_HD inline size_t flash_backward_floats(int b, int HD) {
  return 6 * static_cast<size_t>(b) * HD + static_cast<size_t>(b) * b + 3 * static_cast<size_t>(b);
}
// The tile (Br = Bc) for head size HD: 64, halved while the backward's tiles exceed the budget
// (HD 32 and 64: 64; HD 128: 32; HD 256: 16), never below 8.
TROUPE_HD inline int flash_tile(int HD) {
  int b = 64;
  while (b > 8 && flash_backward_floats(b, HD) * sizeof(float) > kFlashMaxSharedBytes) b /= 2;
  return b;
}

struct FlashShape {
  const int32_t* cu_seqlens;
  int S, N, NH, NKV, HD, tile;
  TROUPE_HD float scale() const { return 1.0f / hd_sqrt(static_cast<float>(HD)); }
  TROUPE_HD int tiles() const { return (N + tile - 1) / tile; }
  TROUPE_HD int seq_start(int t) const { return cu_seqlens[sequence_of(cu_seqlens, S, t)]; }
  TROUPE_HD int seq_end(int t) const { return cu_seqlens[sequence_of(cu_seqlens, S, t) + 1]; }
};

// Consecutive float arrays out of a block's shared memory.
struct SharedCarve {
  float* p;
  TROUPE_HD float* take(size_t n) {
    float* r = p;
    p += n;
    return r;
  }
};

// rows x HD of x (row stride NX*HD, head x_head) into dst; tokens from t0.
TROUPE_HD inline void flash_load_rows(float* dst, const float* x, int t0, int rows, int NX, int x_head, int HD,
                                      int lane, int lanes) {
  for (int i = lane; i < rows * HD; i += lanes) {
    const int r = i / HD, d = i % HD;
    dst[i] = x[(static_cast<size_t>(t0 + r) * NX + x_head) * HD + d];
  }
}

// One row of the forward's online softmax over a tile of scores s[0, cols): the new max m, P = e^(s-m)
// in place (0 where masked), l rescaled and grown, alpha = e^(m_old - m) for the accumulator.
TROUPE_HD inline void flash_online_row(float* s, int cols, float& m, float& l, float& alpha) {
  float mx = m;
  for (int c = 0; c < cols; ++c) mx = hd_max(mx, s[c]);
  float sum = 0.0f;
  alpha = 1.0f;
  if (mx == hd_neg_inf()) {  // every key so far masked: nothing to add, nothing to rescale
    for (int c = 0; c < cols; ++c) s[c] = 0.0f;
  } else {
    alpha = hd_exp(m - mx);
    for (int c = 0; c < cols; ++c) sum += (s[c] = hd_exp(s[c] - mx));
  }
  m = mx;
  l = l * alpha + sum;
}

// Forward, one block per (Q tile, head): out (N, NH, HD), lse (N, NH). The tile's rows see keys
// from their first row's sequence start up to their last row; each score outside a row's own
// sequence or after the row is masked.
struct FlashForwardBody {
  float* out;
  float* lse;
  const float* q;
  const float* k;
  const float* v;
  FlashShape sh;
  TROUPE_HD int blocks() const { return sh.tiles() * sh.NH; }
  template <class Lanes>
  TROUPE_HD void block(const Lanes& L, int blk, unsigned char* smem) const {
    const int B = sh.tile, HD = sh.HD, NH = sh.NH, NKV = sh.NKV, g = (blk % NH) / (NH / NKV), h = blk % NH;
    const int t0 = (blk / NH) * B, rows = hd_min(B, sh.N - t0), lane = L.lane(), nl = L.count();
    const float scale = sh.scale();
    SharedCarve sc{reinterpret_cast<float*>(smem)};
    float *Qs = sc.take(B * HD), *Os = sc.take(B * HD), *Ks = sc.take(B * HD), *Vs = sc.take(B * HD);
    float *Ss = sc.take(B * B), *ms = sc.take(B), *ls = sc.take(B), *as = sc.take(B);
    int* st = reinterpret_cast<int*>(sc.take(B));
    flash_load_rows(Qs, q, t0, rows, NH, h, HD, lane, nl);
    for (int i = lane; i < rows * HD; i += nl) Os[i] = 0.0f;
    for (int r = lane; r < rows; r += nl) {
      ms[r] = hd_neg_inf();
      ls[r] = 0.0f;
      st[r] = sh.seq_start(t0 + r);
    }
    L.sync();
    const int j_end = t0 + rows;
    for (int j0 = st[0]; j0 < j_end; j0 += B) {
      const int cols = hd_min(B, j_end - j0);
      flash_load_rows(Ks, k, j0, cols, NKV, g, HD, lane, nl);
      flash_load_rows(Vs, v, j0, cols, NKV, g, HD, lane, nl);
      L.sync();
      for (int i = lane; i < rows * B; i += nl) {  // S = Q K^T * scale, masked to -inf
        const int r = i / B, c = i % B, j = j0 + c;
        Ss[i] = (c < cols && j >= st[r] && j <= t0 + r) ? dot_hd(Qs + r * HD, Ks + c * HD, HD) * scale
                                                         : hd_neg_inf();
      }
      L.sync();
      for (int r = lane; r < rows; r += nl) flash_online_row(Ss + r * B, cols, ms[r], ls[r], as[r]);
      L.sync();
      for (int i = lane; i < rows * HD; i += nl) {  // O = diag(alpha) O + P V
        const int r = i / HD, d = i % HD;
        float acc = Os[i] * as[r];
        for (int c = 0; c < cols; ++c) acc += Ss[r * B + c] * Vs[c * HD + d];
        Os[i] = acc;
      }
      L.sync();
    }
    for (int i = lane; i < rows * HD; i += nl) {
      const int r = i / HD, d = i % HD;
      out[(static_cast<size_t>(t0 + r) * NH + h) * HD + d] = Os[i] / ls[r];
    }
    for (int r = lane; r < rows; r += nl) lse[static_cast<size_t>(t0 + r) * NH + h] = ms[r] + hd_log(ls[r]);
  }
};

// What both backward bodies read (AttnGrads, attention.h) and the row statistics of one Q tile:
// lse, D = rowsum(dO * O) (computed when the tile is loaded: the op's scratch is sized by the
// longest sequence only, so there is no N*NH buffer for a separate pass) and the sequence start.
TROUPE_HD inline void flash_load_row_stats(float* lse_s, float* D, int* st, const AttnGrads& in, const FlashShape& sh,
                                           int t0, int rows, int h, int lane, int nl) {
  for (int r = lane; r < rows; r += nl) {
    const size_t th = static_cast<size_t>(t0 + r) * sh.NH + h;
    lse_s[r] = in.lse[th];
    D[r] = dot_hd(in.dout + th * sh.HD, in.out + th * sh.HD, sh.HD);
    st[r] = sh.seq_start(t0 + r);
  }
}

// P (rows x B) = e^(Q K^T * scale - lse) with masked entries 0; with `ds`, dS = P (dO V^T - D) * scale.
struct FlashTile {
  const float *Qs, *dOs, *Ks, *Vs, *lse_s, *D;
  const int* st;
  int B, HD, t0, j0, rows, cols;
  float scale;
  TROUPE_HD float p(int r, int c) const {
    const int j = j0 + c;
    if (c >= cols || j < st[r] || j > t0 + r) return 0.0f;
    return hd_exp(dot_hd(Qs + r * HD, Ks + c * HD, HD) * scale - lse_s[r]);
  }
  TROUPE_HD float ds(int r, int c, float p) const {
    return p == 0.0f ? 0.0f : p * (dot_hd(dOs + r * HD, Vs + c * HD, HD) - D[r]) * scale;
  }
};

// dK, dV, one block per (K/V tile, kv head): for each query head of the group and each Q tile that
// can see the keys (from the tile's first key to the end of its last key's sequence), accumulate
// dV += P^T dO and dK += dS^T Q in shared memory. One writer per dK/dV row, no atomics.
struct FlashBackwardDkDvBody {
  float* dk;
  float* dv;
  AttnGrads in;
  FlashShape sh;
  TROUPE_HD int blocks() const { return sh.tiles() * sh.NKV; }
  template <class Lanes>
  TROUPE_HD void block(const Lanes& L, int blk, unsigned char* smem) const {
    const int B = sh.tile, HD = sh.HD, NH = sh.NH, NKV = sh.NKV, g = blk % NKV, group = NH / NKV;
    const int j0 = (blk / NKV) * B, cols = hd_min(B, sh.N - j0), lane = L.lane(), nl = L.count();
    SharedCarve sc{reinterpret_cast<float*>(smem)};
    float *Ks = sc.take(B * HD), *Vs = sc.take(B * HD), *dKs = sc.take(B * HD), *dVs = sc.take(B * HD);
    float *Qs = sc.take(B * HD), *dOs = sc.take(B * HD), *Ps = sc.take(B * B), *lse_s = sc.take(B), *D = sc.take(B);
    int* st = reinterpret_cast<int*>(sc.take(B));
    flash_load_rows(Ks, in.k, j0, cols, NKV, g, HD, lane, nl);
    flash_load_rows(Vs, in.v, j0, cols, NKV, g, HD, lane, nl);
    for (int i = lane; i < cols * HD; i += nl) dKs[i] = dVs[i] = 0.0f;
    const int q_end = sh.seq_end(j0 + cols - 1);
    for (int h = g * group; h < (g + 1) * group; ++h)
      for (int t0 = j0; t0 < q_end; t0 += B) {
        const int rows = hd_min(B, q_end - t0);
        flash_load_rows(Qs, in.q, t0, rows, NH, h, HD, lane, nl);
        flash_load_rows(dOs, in.dout, t0, rows, NH, h, HD, lane, nl);
        flash_load_row_stats(lse_s, D, st, in, sh, t0, rows, h, lane, nl);
        L.sync();
        const FlashTile tile{Qs, dOs, Ks, Vs, lse_s, D, st, B, HD, t0, j0, rows, cols, sh.scale()};
        for (int i = lane; i < rows * B; i += nl) Ps[i] = tile.p(i / B, i % B);
        L.sync();
        for (int i = lane; i < cols * HD; i += nl) {  // dV += P^T dO
          const int c = i / HD, d = i % HD;
          float acc = dVs[i];
          for (int r = 0; r < rows; ++r) acc += Ps[r * B + c] * dOs[r * HD + d];
          dVs[i] = acc;
        }
        L.sync();
        for (int i = lane; i < rows * B; i += nl) Ps[i] = tile.ds(i / B, i % B, Ps[i]);
        L.sync();
        for (int i = lane; i < cols * HD; i += nl) {  // dK += dS^T Q
          const int c = i / HD, d = i % HD;
          float acc = dKs[i];
          for (int r = 0; r < rows; ++r) acc += Ps[r * B + c] * Qs[r * HD + d];
          dKs[i] = acc;
        }
        L.sync();
      }
    for (int i = lane; i < cols * HD; i += nl) {
      const size_t o = (static_cast<size_t>(j0 + i / HD) * NKV + g) * HD + i % HD;
      dk[o] = dKs[i];
      dv[o] = dVs[i];
    }
  }
};

// dQ, one block per (Q tile, head): over the K/V tiles the rows see, dQ += dS K.
struct FlashBackwardDqBody {
  float* dq;
  AttnGrads in;
  FlashShape sh;
  TROUPE_HD int blocks() const { return sh.tiles() * sh.NH; }
  template <class Lanes>
  TROUPE_HD void block(const Lanes& L, int blk, unsigned char* smem) const {
    const int B = sh.tile, HD = sh.HD, NH = sh.NH, NKV = sh.NKV, h = blk % NH, g = h / (NH / NKV);
    const int t0 = (blk / NH) * B, rows = hd_min(B, sh.N - t0), lane = L.lane(), nl = L.count();
    SharedCarve sc{reinterpret_cast<float*>(smem)};
    float *Qs = sc.take(B * HD), *dOs = sc.take(B * HD), *dQs = sc.take(B * HD), *Ks = sc.take(B * HD);
    float *Vs = sc.take(B * HD), *Ps = sc.take(B * B), *lse_s = sc.take(B), *D = sc.take(B);
    int* st = reinterpret_cast<int*>(sc.take(B));
    flash_load_rows(Qs, in.q, t0, rows, NH, h, HD, lane, nl);
    flash_load_rows(dOs, in.dout, t0, rows, NH, h, HD, lane, nl);
    for (int i = lane; i < rows * HD; i += nl) dQs[i] = 0.0f;
    flash_load_row_stats(lse_s, D, st, in, sh, t0, rows, h, lane, nl);
    L.sync();
    const int j_end = t0 + rows;
    for (int j0 = st[0]; j0 < j_end; j0 += B) {
      const int cols = hd_min(B, j_end - j0);
      flash_load_rows(Ks, in.k, j0, cols, NKV, g, HD, lane, nl);
      flash_load_rows(Vs, in.v, j0, cols, NKV, g, HD, lane, nl);
      L.sync();
      const FlashTile tile{Qs, dOs, Ks, Vs, lse_s, D, st, B, HD, t0, j0, rows, cols, sh.scale()};
      for (int i = lane; i < rows * B; i += nl) Ps[i] = tile.ds(i / B, i % B, tile.p(i / B, i % B));
      L.sync();
      for (int i = lane; i < rows * HD; i += nl) {  // dQ += dS K
        const int r = i / HD, d = i % HD;
        float acc = dQs[i];
        for (int c = 0; c < cols; ++c) acc += Ps[r * B + c] * Ks[c * HD + d];
        dQs[i] = acc;
      }
      L.sync();
    }
    for (int i = lane; i < rows * HD; i += nl)
      dq[(static_cast<size_t>(t0 + i / HD) * NH + h) * HD + i % HD] = dQs[i];
  }
};

// Split-K decode: partials per (sequence b, head h, split s) over keys [s*split, (s+1)*split) of
// the first kv_len[b] cache rows: m (largest score), l = sum e^(s-m), acc = sum e^(s-m) v.
struct DecodePartials {
  float* acc;  // (B*NH*splits, HD)
  float* m;    // (B*NH*splits)
  float* l;
};

struct DecodeSplitBody {  // over B*NH*splits
  DecodePartials part;
  const float* q;
  const float* k_cache;
  const float* v_cache;
  const int32_t* kv_len;
  const int32_t* slot;
  int cache_len, NH, NKV, HD, split, splits;
  TROUPE_HD void operator()(size_t i) const {
    const size_t bh = i / static_cast<size_t>(splits);
    const int s = static_cast<int>(i % static_cast<size_t>(splits));
    const int b = static_cast<int>(bh / NH), h = static_cast<int>(bh % NH), g = h / (NH / NKV);
    const float scale = 1.0f / hd_sqrt(static_cast<float>(HD));
    const float* qv = q + bh * HD;
    float* o = part.acc + i * HD;
    for (int d = 0; d < HD; ++d) o[d] = 0.0f;
    float m = hd_neg_inf(), l = 0;
    const size_t stride = static_cast<size_t>(NKV) * HD;
    const size_t first = (static_cast<size_t>(slot ? slot[b] : b) * cache_len * NKV + g) * HD;
    const int j_end = hd_min(kv_len[b], (s + 1) * split);
    for (int j = s * split; j < j_end; ++j)
      online_step(o, m, l, dot_hd(qv, k_cache + first + j * stride, HD) * scale, v_cache + first + j * stride, HD);
    part.m[i] = m;
    part.l[i] = l;
  }
};

struct DecodeCombineBody {  // over B*NH*HD: out = sum_s e^(m_s-M) acc_s / sum_s e^(m_s-M) l_s
  float* out;
  DecodePartials part;
  int HD, splits;
  TROUPE_HD void operator()(size_t i) const {
    const size_t bh = i / static_cast<size_t>(HD), p0 = bh * static_cast<size_t>(splits);
    const int d = static_cast<int>(i % static_cast<size_t>(HD));
    float M = hd_neg_inf();
    for (int s = 0; s < splits; ++s) M = hd_max(M, part.m[p0 + s]);
    float num = 0.0f, den = 0.0f;
    if (M != hd_neg_inf())
      for (int s = 0; s < splits; ++s) {
        if (part.l[p0 + s] == 0.0f) continue;
        const float w = hd_exp(part.m[p0 + s] - M);
        num += w * part.acc[(p0 + s) * HD + d];
        den += w * part.l[p0 + s];
      }
    out[i] = den > 0.0f ? num / den : 0.0f;
  }
};

}  // namespace troupe::kernels::cuda
