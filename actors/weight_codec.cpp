// The weight-sync codec (weight_codec.h): generator dtypes, full and delta payloads, per-tensor
// checksums, the probe. Chunks are encoded and decoded in parallel (OpenMP, the calling role's
// threads); a delta is applied in place and undone (XOR is its own inverse) when a chunk does not
// decode or a tensor fails its checksum, so a receiver never holds a mix of two versions.
#include "troupe/actors/weight_codec.h"

#include <omp.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace troupe::actors {

namespace {

// zstd level 1: the planes are mostly zero runs, which every level finds; higher levels only cost time.
constexpr int kZstdLevel = 1;

inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Bytes per value on the wire: the bf16 half of the bits, or all of them.
size_t width_of(WeightDtype d) { return d == WeightDtype::bf16 ? 2 : 4; }

// The value's bits as sent: bf16 keeps the high half (the low half is zero after rounding).
inline std::uint32_t wire_bits(float f, WeightDtype d) {
  return d == WeightDtype::bf16 ? bits_of(f) >> 16 : bits_of(f);
}
inline std::uint32_t value_bits(std::uint32_t wire, WeightDtype d) { return d == WeightDtype::bf16 ? wire << 16 : wire; }

size_t chunk_count(size_t elements, size_t chunk) { return chunk == 0 ? 0 : (elements + chunk - 1) / chunk; }

// One ZSTD context per OpenMP thread and call (contexts are not shareable between threads).
struct CCtx {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ~CCtx() { ZSTD_freeCCtx(c); }
};
struct DCtx {
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ~DCtx() { ZSTD_freeDCtx(d); }
};

}  // namespace

WeightDtype weight_dtype_of(const std::string& name) { return name == "bf16" ? WeightDtype::bf16 : WeightDtype::fp32; }
const char* weight_dtype_name(WeightDtype d) { return d == WeightDtype::bf16 ? "bf16" : "fp32"; }
const char* weights_status_name(WeightsStatus s) {
  switch (s) {
    case WeightsStatus::applied: return "applied";
    case WeightsStatus::checksum_failed: return "checksum_failed";
    case WeightsStatus::refused: return "refused";
    case WeightsStatus::probe_mismatch: return "probe_mismatch";
  }
  return "unknown";
}

float round_to_bf16(float x) {
  std::uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return float_of((u | 0x00400000u) & 0xffff0000u);  // NaN: quiet, kept
  u += 0x7fffu + ((u >> 16) & 1u);  // ties to even; a value past the largest bf16 becomes infinity
  return float_of(u & 0xffff0000u);
}

void round_to_dtype(std::span<float> values, WeightDtype dtype) {
  if (dtype != WeightDtype::bf16) return;
  const auto n = static_cast<std::ptrdiff_t>(values.size());
  float* v = values.data();
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) v[i] = round_to_bf16(v[i]);
}

std::vector<std::uint64_t> tensor_checksums(std::span<const float> values,
                                            const std::vector<policy::TensorSpec>& tensors) {
  std::vector<std::uint64_t> out(tensors.size(), 0);
  const auto n = static_cast<std::ptrdiff_t>(tensors.size());
#pragma omp parallel for schedule(dynamic)
  for (std::ptrdiff_t t = 0; t < n; ++t) {
    const auto& s = tensors[static_cast<size_t>(t)];
    if (s.offset + s.numel() > values.size()) continue;  // (the caller checked the table against the arena)
    out[static_cast<size_t>(t)] = XXH3_64bits(values.data() + s.offset, s.numel() * sizeof(float));
  }
  return out;
}

// ---- learner 0: encoding ----------------------------------------------------------------------

WeightEncoder::WeightEncoder(WeightDtype dtype, std::vector<policy::TensorSpec> tensors)
    : dtype_(dtype), tensors_(std::move(tensors)) {}

void WeightEncoder::encode(std::span<const float> master, std::int64_t version, bool delta, Weights& out) {
  const size_t n = master.size(), W = width_of(dtype_), C = kWeightChunkElements;
  delta = delta && held_version_ >= 0 && held_.size() == n;
  if (held_.size() != n) held_.assign(n, 0.0f);
  const size_t chunks = chunk_count(n, C);
  out = Weights{};
  out.version = version;
  out.base_version = delta ? held_version_ : -1;
  out.encoding = static_cast<std::int32_t>(delta ? WeightEncoding::delta : WeightEncoding::full);
  out.dtype = static_cast<std::int32_t>(dtype_);
  out.elements = n;
  out.chunk_elements = C;
  out.chunk_bytes.assign(chunks, 0);
  out.chunk_zstd.assign(chunks, 0);
  const WeightDtype dt = dtype_;
  float* held = held_.data();
  const float* m = master.data();
  if (!delta) {
    // Full: every value's wire bits, element after element, uncompressed (most bits of a weight are noise).
    out.payload.resize(n * W);
    std::uint8_t* dst = out.payload.data();
    const auto N = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < N; ++i) {
      const float v = dt == WeightDtype::bf16 ? round_to_bf16(m[i]) : m[i];
      held[i] = v;
      const std::uint32_t b = wire_bits(v, dt);
      std::memcpy(dst + static_cast<size_t>(i) * W, &b, W);  // little-endian: the low W bytes
    }
    for (size_t c = 0; c < chunks; ++c) out.chunk_bytes[c] = std::min(C, n - c * C) * W;
  } else {
    // Delta: per chunk, the XOR's byte planes (all low bytes, then the next ...), then zstd.
    std::vector<std::vector<std::uint8_t>> frames(chunks);
    std::uint64_t changed = 0;
    const auto K = static_cast<std::ptrdiff_t>(chunks);
#pragma omp parallel reduction(+ : changed)
    {
      CCtx ctx;
      std::vector<std::uint8_t> planes;
#pragma omp for schedule(dynamic)
      for (std::ptrdiff_t k = 0; k < K; ++k) {
        const size_t c = static_cast<size_t>(k), a = c * C, len = std::min(C, n - a);
        planes.resize(len * W);
        for (size_t i = 0; i < len; ++i) {
          const float v = dt == WeightDtype::bf16 ? round_to_bf16(m[a + i]) : m[a + i];
          const std::uint32_t x = wire_bits(v, dt) ^ wire_bits(held[a + i], dt);
          changed += x != 0;
          held[a + i] = v;
          for (size_t p = 0; p < W; ++p) planes[p * len + i] = static_cast<std::uint8_t>(x >> (8 * p));
        }
        auto& f = frames[c];
        f.resize(ZSTD_compressBound(planes.size()));
        const size_t z = ZSTD_compressCCtx(ctx.c, f.data(), f.size(), planes.data(), planes.size(), kZstdLevel);
        if (ZSTD_isError(z) || z >= planes.size()) {
          f.assign(planes.begin(), planes.end());  // incompressible: stored as is
        } else {
          f.resize(z);
          out.chunk_zstd[c] = 1;
        }
      }
    }
    size_t total = 0;
    for (size_t c = 0; c < chunks; ++c) total += (out.chunk_bytes[c] = frames[c].size());
    out.payload.resize(total);
    size_t at = 0;
    for (auto& f : frames) {
      std::memcpy(out.payload.data() + at, f.data(), f.size());
      at += f.size();
    }
    out.changed = changed;
  }
  held_version_ = version;
  out.checksums = tensor_checksums(held_, tensors_);
}

// ---- a generator: applying ----------------------------------------------------------------------

WeightsApplied apply_weights(const Weights& w, std::span<float> values, const std::vector<policy::TensorSpec>& tensors,
                             WeightDtype dtype) {
  auto refused = [](std::string why) { return WeightsApplied{WeightsStatus::refused, std::move(why)}; };
  auto corrupt = [](std::string why) { return WeightsApplied{WeightsStatus::checksum_failed, std::move(why)}; };
  const auto enc = static_cast<WeightEncoding>(w.encoding);
  if (enc != WeightEncoding::full && enc != WeightEncoding::delta)
    return refused("encoding " + std::to_string(w.encoding) + " is neither full (1) nor delta (2)");
  if (w.dtype != static_cast<std::int32_t>(dtype))
    return refused(std::string("the weights are in ") +
                   weight_dtype_name(static_cast<WeightDtype>(w.dtype)) + ", this generator holds " +
                   weight_dtype_name(dtype) + " (weight_sync.dtype differs between the ranks)");
  if (w.elements != values.size())
    return refused(std::to_string(w.elements) + " values for a model of " + std::to_string(values.size()));
  if (w.checksums.size() != tensors.size())
    return refused(std::to_string(w.checksums.size()) + " tensor checksums for a model of " +
                   std::to_string(tensors.size()) + " tensors");
  const size_t n = values.size(), W = width_of(dtype), C = w.chunk_elements;
  const size_t chunks = chunk_count(n, C);
  if (C == 0 && n > 0) return corrupt("chunk_elements is 0");
  if (w.chunk_bytes.size() != chunks || w.chunk_zstd.size() != chunks)
    return corrupt(std::to_string(w.chunk_bytes.size()) + " chunks for " + std::to_string(n) + " values in chunks of " +
                   std::to_string(C));
  std::vector<size_t> at(chunks + 1, 0);
  for (size_t c = 0; c < chunks; ++c) at[c + 1] = at[c] + w.chunk_bytes[c];
  if (at[chunks] != w.payload.size())
    return corrupt("the chunks add up to " + std::to_string(at[chunks]) + " bytes, the payload has " +
                   std::to_string(w.payload.size()));
  const auto K = static_cast<std::ptrdiff_t>(chunks);
  const std::uint8_t* src = w.payload.data();

  auto checksum_failure = [&](std::span<const float> v) -> std::string {
    auto sums = tensor_checksums(v, tensors);
    for (size_t t = 0; t < tensors.size(); ++t)
      if (sums[t] != w.checksums[t])
        return "tensor " + tensors[t].name + " fails its checksum after version " + std::to_string(w.version) +
               (enc == WeightEncoding::delta ? " was applied to base version " + std::to_string(w.base_version) : "");
    return {};
  };

  if (enc == WeightEncoding::full) {
    for (size_t c = 0; c < chunks; ++c)
      if (w.chunk_zstd[c] != 0 || w.chunk_bytes[c] != std::min(C, n - c * C) * W)
        return corrupt("full chunk " + std::to_string(c) + " has " + std::to_string(w.chunk_bytes[c]) + " bytes");
    std::vector<float> fresh(n);
    float* f = fresh.data();
    const auto N = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < N; ++i) {
      std::uint32_t b = 0;
      std::memcpy(&b, src + static_cast<size_t>(i) * W, W);
      f[i] = float_of(value_bits(b, dtype));
    }
    if (auto bad = checksum_failure(fresh); !bad.empty()) return corrupt(bad);
    std::copy(fresh.begin(), fresh.end(), values.begin());
    return {};
  }

  // Delta, in place. xor_chunks XORs the chunks `which` selects into values; run twice it restores them.
  std::vector<std::uint8_t> applied(chunks, 0);
  std::atomic<std::ptrdiff_t> bad_chunk{-1};
  float* v = values.data();
  auto xor_chunks = [&](const std::vector<std::uint8_t>* which) {
#pragma omp parallel
    {
      DCtx ctx;
      std::vector<std::uint8_t> planes;
#pragma omp for schedule(dynamic)
      for (std::ptrdiff_t k = 0; k < K; ++k) {
        const size_t c = static_cast<size_t>(k), a = c * C, len = std::min(C, n - a);
        if (which && !(*which)[c]) continue;
        planes.resize(len * W);
        if (w.chunk_zstd[c]) {
          const size_t r = ZSTD_decompressDCtx(ctx.d, planes.data(), planes.size(), src + at[c], w.chunk_bytes[c]);
          if (ZSTD_isError(r) || r != planes.size()) {
            bad_chunk.store(k);
            continue;
          }
        } else {
          if (w.chunk_bytes[c] != planes.size()) {
            bad_chunk.store(k);
            continue;
          }
          std::memcpy(planes.data(), src + at[c], planes.size());
        }
        for (size_t i = 0; i < len; ++i) {
          std::uint32_t x = 0;
          for (size_t p = 0; p < W; ++p) x |= static_cast<std::uint32_t>(planes[p * len + i]) << (8 * p);
          v[a + i] = float_of(bits_of(v[a + i]) ^ value_bits(x, dtype));
        }
        if (!which) applied[c] = 1;
      }
    }
  };
  xor_chunks(nullptr);
  std::string why;
  if (bad_chunk.load() >= 0)
    why = "delta chunk " + std::to_string(bad_chunk.load()) + " of version " + std::to_string(w.version) +
          " does not decode";
  else
    why = checksum_failure(values);
  if (!why.empty()) xor_chunks(&applied);  // back to the base version, bit for bit
  return why.empty() ? WeightsApplied{} : corrupt(why);
}

// ---- the probe ----------------------------------------------------------------------------------

std::vector<std::int32_t> probe_tokens(int vocab_size) {
  constexpr int kProbeLength = 32;
  std::vector<std::int32_t> t(kProbeLength);
  const auto V = static_cast<std::uint64_t>(std::max(1, vocab_size));
  for (int i = 0; i < kProbeLength; ++i)  // a prime stride: ids spread over the vocabulary, none repeated early
    t[static_cast<size_t>(i)] = static_cast<std::int32_t>((static_cast<std::uint64_t>(i) * 7919u + 13u) % V);
  return t;
}

Result<std::vector<float>> probe_logprobs(policy::Model& model, const std::vector<std::int32_t>& tokens) {
  if (tokens.size() < 2) return invalid_input("probe: the sequence needs two tokens at least");
  policy::PackedBatch b;
  b.tokens = tokens;
  b.cu_seqlens = {0, static_cast<std::int32_t>(tokens.size())};
  b.targets.assign(tokens.size(), -1);
  for (size_t t = 0; t + 1 < tokens.size(); ++t) b.targets[t] = tokens[t + 1];
  std::vector<float> logp(tokens.size()), entropy(tokens.size());
  TROUPE_TRY(model.forward_train(b, 1.0f, logp.data(), entropy.data()));
  logp.resize(tokens.size() - 1);
  return logp;
}

std::int64_t first_bit_difference(std::span<const float> a, std::span<const float> b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (bits_of(a[i]) != bits_of(b[i])) return static_cast<std::int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<std::int64_t>(n);
}

}  // namespace troupe::actors
