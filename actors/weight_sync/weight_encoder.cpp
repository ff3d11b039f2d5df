// Learner 0's side of the codec (weight_encoder.h): its weights into a full payload or a delta's
// chunks (delta_coding.h), the values sent last kept in wire form as the receivers' base, and a
// delta prepared during the optimizer's step. Whatever the path (master, prepared, fused hashing or
// not), a version's message is the same bit for bit.
#include "troupe/actors/weight_encoder.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <memory>
#include <utility>

#include "delta_coding.h"
#include "wire_format.h"
#include "wire_hash.h"

namespace troupe::actors {

using namespace codec;

namespace {

// A payload's memory, which the encoder writes again for a later message once no message points
// into it any more (a message's Bytes hold a reference while they live). A fresh allocation for
// every message costs page faults: 0.13 s for a 269 MB full payload on the bench's VM.
class PayloadBuffer final : public runtime::SharedBuffer {
 public:
  explicit PayloadBuffer(size_t n) : data_(new char[n]), capacity_(n) {}  // (not zero-filled)
  char* data() { return data_.get(); }
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t capacity_;
};

// One reusable buffer per kind of payload (full, delta).
class PayloadPool {
 public:
  enum Kind { kFull = 0, kDelta = 1 };
  PayloadPool() = default;
  PayloadPool(const PayloadPool&) = delete;
  PayloadPool& operator=(const PayloadPool&) = delete;
  ~PayloadPool() {
    for (auto* b : slot_)
      if (b) b->release();
  }
  // A buffer of at least n bytes that no message uses (the kept one, or a new one in its place).
  PayloadBuffer* take(Kind kind, size_t n) {
    PayloadBuffer*& b = slot_[kind];
    if (b && (b->use_count() != 1 || b->capacity() < n)) {
      b->release();  // (a message still using it keeps it alive until it is done)
      b = nullptr;
    }
    if (!b) b = new PayloadBuffer(kind == kDelta ? n + n / 4 : n);  // deltas vary: some headroom
    return b;
  }

 private:
  PayloadBuffer* slot_[2] = {nullptr, nullptr};
};

}  // namespace

struct WeightEncoder::Frames {
  std::vector<Buffer> chunk;  // per chunk: its compressed frame (or its raw bytes, stored as they are)
  ChunkPlan plan;             // (made for the arena's size on first use)
  size_t planned_for = SIZE_MAX;
  PayloadPool payloads;       // the messages' payload memory, reused
  // The delta chunks' plan for an arena of n values (made once per size).
  const ChunkPlan& plan_for(const std::vector<policy::TensorSpec>& tensors, size_t n) {
    if (planned_for != n) {
      plan = plan_chunks(tensors, n, kWeightChunkElements);
      planned_for = n;
    }
    return plan;
  }
};

namespace {

// A growing array of trivially copyable T that keeps its memory between steps (not
// value-initialized: every element used is written first).
template <class T>
struct GrowBuffer {
  std::unique_ptr<T[]> data;
  size_t capacity = 0, size = 0;
  T* room_for(size_t more) {  // room for `more` past size; the pointer is to data[size]
    if (size + more > capacity) {
      const size_t cap = std::max(size + more, capacity + capacity / 2);
      std::unique_ptr<T[]> grown(new T[cap]);
      if (size) std::memcpy(grown.get(), data.get(), size * sizeof(T));
      data = std::move(grown);
      capacity = cap;
    }
    return data.get() + size;
  }
};

// One chunk's changes as a step prepared them: the sparse layout's gaps, the changed values' XORs
// (wire form) and the position after the last change (where the next gap counts from).
struct PreparedChunk {
  GrowBuffer<std::uint8_t> gaps;
  GrowBuffer<std::uint16_t> xors;
  size_t next = 0;
  void clear() { gaps.size = xors.size = next = 0; }
};

// master[b, e) (a piece of one chunk starting at chunk_start) scanned against held (sparse_scan):
// the changes go into pc, the new wire values into the checksum st. The same gaps, XORs and hash
// as encode_sparse over the chunk.
void prepare_piece(const float* m, std::uint16_t* held, size_t b, size_t e, size_t chunk_start, PreparedChunk& pc,
                   XXH3_state_t* st) {
  alignas(64) std::uint16_t packed[kHashBlock];
  for (size_t a = b; a < e; a += kHashBlock) {
    const size_t len = std::min(kHashBlock, e - a);
    // a byte per change, and the 255s of the gaps since the chunk's last change (before this piece too)
    std::uint8_t* gaps = pc.gaps.room_for(len + (a + len - chunk_start - pc.next) / 255 + 1);
    std::uint16_t* xors = pc.xors.room_for(len);
    SparseCursor c{0, 0, pc.next};
    sparse_scan(m + a, held + a, len, a - chunk_start, gaps, xors, c, packed);
    pc.gaps.size += c.g;
    pc.xors.size += c.j;
    pc.next = c.next;
    XXH3_64bits_update(st, packed, len * 2);
  }
}

// The encoder's held values of wire width W.
template <int W>
std::vector<WireT<W>>& held_of(std::vector<std::uint16_t>& held16, std::vector<std::uint32_t>& held32) {
  if constexpr (W == 2) return held16;
  else return held32;
}

// A chunk's raw bytes into its frame f, compressed (or as they are when that does not make them
// shorter); format gets the chunk's flags.
void seal(const std::uint8_t* raw, size_t raw_size, bool sparse, Buffer& f, std::uint8_t& format, int level) {
  ThreadScratch& ts = thread_scratch();
  format = sparse ? kChunkSparse : 0;
  const size_t bound = ZSTD_compressBound(raw_size);
  std::uint8_t* dst = f.reserve(bound);
  const size_t z = ZSTD_compressCCtx(ts.compressor(), dst, bound, raw, raw_size, level);
  if (ZSTD_isError(z) || z >= raw_size) {
    std::memcpy(dst, raw, raw_size);  // incompressible: stored as is
    f.size = raw_size;
  } else {
    f.size = z;
    format |= kChunkZstd;
  }
}

// The delta chunk of values [a, e) from the master: held becomes the new values, f the chunk's
// frame; hashed into st when given. Returns how many values changed. level: zstd's (0: the
// layout's default).
template <int W>
size_t encode_delta_chunk(const float* m, WireT<W>* held, size_t a, size_t e, XXH3_state_t* st, Buffer& f,
                          std::uint8_t& format, int level) {
  constexpr bool sparse = W == 2;
  ThreadScratch& ts = thread_scratch();
  const size_t len = e - a;
  size_t ch = 0, raw_size = 0;
  std::uint8_t* raw = ts.raw.reserve(sparse ? sparse_bound(len, W) : len * W);
  auto* x = reinterpret_cast<std::uint32_t*>(ts.xors.reserve(len * 4));
  if constexpr (sparse) {
    ch = encode_sparse(m + a, held + a, len, raw, reinterpret_cast<std::uint16_t*>(x), &raw_size, st);
  } else {
    ch = encode_dense<W>(m + a, held + a, len, x, st);
    raw_size = len * W;
    split_planes<W>(x, len, raw);
  }
  seal(raw, raw_size, sparse, f, format, level != 0 ? level : sparse ? kZstdLevelSparse : kZstdLevelDense);
  return ch;
}

// The payload of the frames, one after the other, into out (its chunk_bytes too).
void gather_frames(const std::vector<Buffer>& frames, PayloadPool& payloads, Weights& out) {
  const size_t chunks = out.chunk_bytes.size();
  size_t total = 0;
  for (size_t c = 0; c < chunks; ++c) total += (out.chunk_bytes[c] = frames[c].size);
  PayloadBuffer* buf = payloads.take(PayloadPool::kDelta, total);
  size_t at = 0;
  for (size_t c = 0; c < chunks; ++c) {
    std::memcpy(buf->data() + at, frames[c].data.get(), frames[c].size);
    at += frames[c].size;
  }
  out.payload = runtime::Bytes::shared(buf, buf->data(), total);
}

// Calls fn(position in the arena, XOR) for each recorded change, the chunks on the OpenMP threads.
template <class Fn>
void for_each_change(const std::vector<PreparedChunk>& chunks, const ChunkPlan& plan, Fn&& fn) {
  const auto K = static_cast<std::ptrdiff_t>(chunks.size());
#pragma omp parallel for schedule(dynamic)
  for (std::ptrdiff_t k = 0; k < K; ++k) {
    const PreparedChunk& pc = chunks[static_cast<size_t>(k)];
    size_t g = 0, next = plan.start[static_cast<size_t>(k)];
    for (size_t j = 0; j < pc.xors.size; ++j) {
      size_t gap = 0;
      while (pc.gaps.data[g] == 255) gap += 255, ++g;
      gap += pc.gaps.data[g++];
      fn(next + gap, pc.xors.data[j]);
      next += gap + 1;
    }
  }
}

// A step's recorded chunks sealed into frames (the sparse layout from each record). Returns how
// many values changed.
size_t seal_prepared(const std::vector<PreparedChunk>& chunks, std::vector<Buffer>& frames,
                     std::vector<std::uint8_t>& format) {
  size_t changed = 0;
  const auto K = static_cast<std::ptrdiff_t>(chunks.size());
#pragma omp parallel for schedule(dynamic) reduction(+ : changed)
  for (std::ptrdiff_t k = 0; k < K; ++k) {
    const auto c = static_cast<size_t>(k);
    const PreparedChunk& pc = chunks[c];
    const size_t j = pc.xors.size, G = pc.gaps.size;
    std::uint8_t* raw = thread_scratch().raw.reserve(4 + G + 2 * j);
    if (G) std::memcpy(raw + 4, pc.gaps.data.get(), G);
    seal(raw, finish_sparse(raw, G, pc.xors.data.get(), j), true, frames[c], format[c], kZstdLevelSparse);
    changed += j;
  }
  return changed;
}

}  // namespace

struct WeightEncoder::Prepared {
  enum class State { none, preparing, ready };
  State state = State::none;
  size_t n = 0;
  std::vector<std::pair<size_t, size_t>> ranges;  // per unit of the plan: its tensor's values
  std::vector<size_t> cursor;                      // per unit: the chunk its next block is in
  std::vector<PreparedChunk> chunks;               // per chunk of the plan
  std::vector<XXH3_state_t*> hash;                 // per unit
  std::vector<std::uint64_t> checksums;            // per tensor, of the step's values
  std::int64_t encodes = 0;
  void reset() {  // nothing prepared (the caller has dealt with held)
    for (auto& c : chunks) c.clear();
    state = State::none;
  }
  ~Prepared() {
    for (auto* h : hash) XXH3_freeState(h);
  }
};

// The held copy's views (lean memory): full payloads point into held16_/held32_ and hold a
// reference to this. Once detached (a view outlived the held copy's next write) it keeps that
// memory itself until the last view goes.
struct WeightEncoder::HeldViews final : public runtime::SharedBuffer {
  std::vector<std::uint16_t> keep16;
  std::vector<std::uint32_t> keep32;
};

WeightEncoder::WeightEncoder(WeightDtype dtype, std::vector<policy::TensorSpec> tensors)
    : dtype_(dtype),
      tensors_(std::move(tensors)),
      frames_(std::make_unique<Frames>()),
      prepared_(std::make_unique<Prepared>()) {}
WeightEncoder::~WeightEncoder() {
  if (held_views_) held_views_->release();
}

void WeightEncoder::detach_held() {
  if (!held_views_ || held_views_->use_count() == 1) return;
  HeldViews* old = std::exchange(held_views_, nullptr);
  old->keep16 = std::move(held16_);  // (a move keeps the memory the views point into)
  old->keep32 = std::move(held32_);
  held16_.assign(old->keep16.begin(), old->keep16.end());
  held32_.assign(old->keep32.begin(), old->keep32.end());
  old->release();
}

std::span<const std::pair<size_t, size_t>> WeightEncoder::begin_prepare(size_t n) {
  Prepared& p = *prepared_;
  detach_held();
  if (p.state != Prepared::State::none) undo_prepared();  // a second step: against the same base again
  if (dtype_ != WeightDtype::bf16 || held_version_ < 0 || held16_.size() != n) return {};
  const ChunkPlan& plan = frames_->plan_for(tensors_, n);
  if (plan.units.empty()) return {};
  if (p.n != n || p.ranges.size() != plan.units.size()) {
    p.n = n;
    p.ranges.clear();
    for (const auto& u : plan.units) p.ranges.emplace_back(plan.start[u.first], plan.start[u.last]);
    p.chunks = std::vector<PreparedChunk>(plan.chunks());
    for (auto* h : p.hash) XXH3_freeState(h);
    p.hash.assign(plan.units.size(), nullptr);
    for (auto*& h : p.hash) h = XXH3_createState();
  }
  p.cursor.resize(plan.units.size());
  for (size_t u = 0; u < plan.units.size(); ++u) {
    p.cursor[u] = plan.units[u].first;
    XXH3_64bits_reset(p.hash[u]);
  }
  p.state = Prepared::State::preparing;
  return p.ranges;
}

void WeightEncoder::prepare_block(size_t range, size_t begin, size_t end, const float* master) {
  Prepared& p = *prepared_;
  const ChunkPlan& plan = frames_->plan;
  size_t& c = p.cursor[range];
  while (begin < end) {
    while (plan.start[c + 1] <= begin) ++c;  // the chunk holding `begin` (blocks come in order)
    const size_t e = std::min(end, plan.start[c + 1]);
    prepare_piece(master, held16_.data(), begin, e, plan.start[c], p.chunks[c], p.hash[range]);
    begin = e;
  }
}

void WeightEncoder::end_prepare() {
  Prepared& p = *prepared_;
  if (p.state != Prepared::State::preparing) return;
  const ChunkPlan& plan = frames_->plan;
  p.checksums.assign(tensors_.size(), empty_checksum());  // (a tensor of no values is in no unit)
  for (size_t u = 0; u < plan.units.size(); ++u) p.checksums[plan.units[u].tensor] = XXH3_64bits_digest(p.hash[u]);
  p.state = Prepared::State::ready;
}

bool WeightEncoder::has_prepared() const { return prepared_->state == Prepared::State::ready; }
std::int64_t WeightEncoder::prepared_encodes() const { return prepared_->encodes; }

void WeightEncoder::discard_prepared() {
  if (prepared_->state != Prepared::State::none) undo_prepared();
}

void WeightEncoder::undo_prepared() {
  std::uint16_t* held = held16_.data();
  for_each_change(prepared_->chunks, frames_->plan, [held](size_t at, std::uint16_t x) { held[at] ^= x; });
  prepared_->reset();
}

void WeightEncoder::encode(std::span<const float> master, std::int64_t version, bool delta, Weights& out) {
  if (dtype_ == WeightDtype::bf16)
    encode_as<2>(master, version, delta, out);
  else
    encode_as<4>(master, version, delta, out);
}

bool WeightEncoder::use_prepared(bool delta, size_t n) {
  Prepared& p = *prepared_;
  const bool from_prepared = delta && p.state == Prepared::State::ready && p.n == n;
  if (!from_prepared && p.state != Prepared::State::none) {
    if (delta) {
      undo_prepared();
    } else {  // a full encoding rewrites all of held
      p.reset();
    }
  }
  return from_prepared;
}

template <int W>
void WeightEncoder::encode_as(std::span<const float> master, std::int64_t version, bool delta, Weights& out) {
  auto& held_wire = held_of<W>(held16_, held32_);
  const size_t n = master.size(), C = kWeightChunkElements;
  delta = delta && held_version_ >= 0 && held_wire.size() == n;
  bool from_prepared = false;
  out = Weights{};  // (first: a view of held that `out` was is let go before held is written)
  detach_held();
  if constexpr (W == 2) from_prepared = use_prepared(delta, n);  // a step's prepared delta: held already holds its values
  if (held_wire.size() != n) held_wire.assign(n, 0);
  out.version = version;
  out.base_version = delta ? held_version_ : -1;
  out.encoding = static_cast<std::int32_t>(delta ? WeightEncoding::delta : WeightEncoding::full);
  out.dtype = static_cast<std::int32_t>(dtype_);
  out.elements = n;
  out.chunk_elements = C;
  if (delta && !encode_delta_into<W>(master.data(), n, from_prepared, out)) {  // lean: too big, in full
    out.base_version = -1;
    out.encoding = static_cast<std::int32_t>(WeightEncoding::full);
    out.chunk_starts.clear();
    out.checksums.clear();
    out.changed = 0;
    delta = false;
  }
  if (!delta) encode_full_into<W>(master.data(), n, out);
  held_version_ = version;
}

template <int W>
void WeightEncoder::encode_full_into(const float* m, size_t n, Weights& out) {
  WireT<W>* held = held_of<W>(held16_, held32_).data();
  if (compress_full_) {  // the delta against zeros, in a delta's chunks and layouts, at kZstdLevelFull
    std::fill(held, held + n, WireT<W>{0});
    (void)encode_delta_into<W>(m, n, false, out, kZstdLevelFull);  // (never abandoned: no cap at that level)
    return;
  }
  // Every value's wire bits, element after element, uncompressed (most bits of a weight are noise).
  const size_t C = kWeightChunkElements, chunks = chunk_count(n, C);
  out.chunk_bytes.assign(chunks, 0);
  out.chunk_format.assign(chunks, 0);
  if (lean_) {  // the payload is the held copy's bytes: a view of them
    encode_wire<W>(m, held, n);
    if (!held_views_) held_views_ = new HeldViews();
    out.payload = runtime::Bytes::shared(held_views_, reinterpret_cast<const char*>(held), n * W);
  } else {
    PayloadBuffer* buf = frames_->payloads.take(PayloadPool::kFull, n * W);
    encode_full<W>(m, held, reinterpret_cast<std::uint8_t*>(buf->data()), n);
    out.payload = runtime::Bytes::shared(buf, buf->data(), n * W);
  }
  for (size_t c = 0; c < chunks; ++c) out.chunk_bytes[c] = std::min(C, n - c * C) * W;
  // the held wire form is exactly what the checksums cover, and the payload
  out.checksums = payload_checksums(reinterpret_cast<const std::uint8_t*>(held), W, tensors_);
}

template <int W>
bool WeightEncoder::encode_delta_into(const float* m, size_t n, bool from_prepared, Weights& out, int level) {
  // Per chunk, the gaps between changed values and their XORs' byte planes (bf16: few change), or
  // the planes of every value's XOR (fp32: nearly all change), then zstd.
  WireT<W>* held = held_of<W>(held16_, held32_).data();
  const ChunkPlan& plan = frames_->plan_for(tensors_, n);
  const size_t chunks = plan.chunks();
  out.chunk_bytes.assign(chunks, 0);
  out.chunk_format.assign(chunks, 0);
  out.chunk_starts.assign(plan.start.begin(), plan.start.end() - 1);
  auto& frames = frames_->chunk;
  frames.resize(chunks);
  const bool fused = !plan.units.empty();
  if (fused) out.checksums.assign(tensors_.size(), 0);
  // One chunk: held becomes the new values, frames[c] its frame; hashed into st when given. Lean
  // memory: once the frames come to more than the cap, the rest is skipped (the delta abandoned).
  const size_t cap = lean_ && level == 0 ? n * W / kLeanDeltaShare : 0;
  std::atomic<size_t> framed{0};
  std::atomic<bool> over{false};
  auto encode_chunk = [&](size_t c, XXH3_state_t* st) -> size_t {
    if (over.load(std::memory_order_relaxed)) return 0;
    const size_t ch = encode_delta_chunk<W>(m, held, plan.start[c], plan.start[c + 1], st, frames[c],
                                            out.chunk_format[c], level);
    if (cap > 0 && framed.fetch_add(frames[c].size) + frames[c].size > cap) over.store(true);
    return ch;
  };
  std::uint64_t changed = 0;
  if (from_prepared) {  // the step did the reading, comparing and hashing: the same layout from its record
    changed = seal_prepared(prepared_->chunks, frames, out.chunk_format);
    out.checksums = prepared_->checksums;
    prepared_->reset();
    ++prepared_->encodes;
  } else if (fused) {
    const auto U = static_cast<std::ptrdiff_t>(plan.units.size());
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : changed)
    for (std::ptrdiff_t u = 0; u < U; ++u) {
      const auto& unit = plan.units[static_cast<size_t>(u)];
      XXH3_state_t* st = thread_scratch().hasher();
      XXH3_64bits_reset(st);
      for (size_t c = unit.first; c < unit.last; ++c) changed += encode_chunk(c, st);
      out.checksums[unit.tensor] = XXH3_64bits_digest(st);
    }
  } else {
    const auto K = static_cast<std::ptrdiff_t>(chunks);
#pragma omp parallel for schedule(dynamic) reduction(+ : changed)
    for (std::ptrdiff_t k = 0; k < K; ++k) changed += encode_chunk(static_cast<size_t>(k), nullptr);
  }
  if (!over.load()) gather_frames(frames, frames_->payloads, out);
  if (lean_) frames.clear();  // (the scratch given back)
  if (over.load()) return false;
  out.changed = changed;
  // the held wire form is exactly what the checksums cover
  if (from_prepared) return true;
  if (!fused) out.checksums = payload_checksums(reinterpret_cast<const std::uint8_t*>(held), W, tensors_);
  else  // a tensor of no values is in no unit
    for (size_t t = 0; t < tensors_.size(); ++t)
      if (tensors_[t].numel() == 0) out.checksums[t] = empty_checksum();
  return true;
}

void WeightEncoder::held_into(std::span<float> out) const {
  const auto n = static_cast<std::ptrdiff_t>(std::min(out.size(), dtype_ == WeightDtype::bf16 ? held16_.size() : held32_.size()));
  float* o = out.data();
  if (dtype_ == WeightDtype::bf16) {
    const std::uint16_t* h = held16_.data();
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < n; ++i) o[i] = std::bit_cast<float>(static_cast<std::uint32_t>(h[i]) << 16);
    // While a step's delta is prepared, held16_ holds its values: the base is them XOR its changes.
    const Prepared& p = *prepared_;
    if (p.state != Prepared::State::none && out.size() == held16_.size())
      for_each_change(p.chunks, frames_->plan, [o](size_t at, std::uint16_t x) {
        o[at] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(o[at]) ^ (static_cast<std::uint32_t>(x) << 16));
      });
  } else {
    std::memcpy(o, held32_.data(), static_cast<size_t>(n) * 4);
  }
}

std::vector<float> WeightEncoder::held() const {
  std::vector<float> v(dtype_ == WeightDtype::bf16 ? held16_.size() : held32_.size());
  held_into(v);
  return v;
}

}  // namespace troupe::actors
