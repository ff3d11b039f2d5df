// A generator's side of the codec (weight_decoder.h): a Weights message checked against the
// generator's model (dtype, size, tensor table, chunk layout), then applied: a full payload after
// its checksums match, a delta in place with each tensor hashed as it is applied and everything
// undone (XOR again) when a chunk does not decode or a checksum fails: never a mix of two versions.
#include "troupe/actors/weight_decoder.h"

#include <omp.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "delta_coding.h"
#include "wire_format.h"
#include "wire_hash.h"

namespace troupe::actors {

using namespace codec;

namespace {

WeightsApplied refused(std::string why) { return WeightsApplied{WeightsStatus::refused, std::move(why)}; }
WeightsApplied corrupt(std::string why) { return WeightsApplied{WeightsStatus::checksum_failed, std::move(why)}; }

// Why w is not for values of this shape and dtype ("" when it is).
std::string refusal(const Weights& w, size_t n, const std::vector<policy::TensorSpec>& tensors, WeightDtype dtype) {
  const auto enc = static_cast<WeightEncoding>(w.encoding);
  if (enc != WeightEncoding::full && enc != WeightEncoding::delta)
    return "encoding " + std::to_string(w.encoding) + " is neither full (1) nor delta (2)";
  if (w.dtype != static_cast<std::int32_t>(dtype))
    return std::string("the weights are in ") + enum_string(static_cast<WeightDtype>(w.dtype)) +
           ", this generator holds " + enum_string(dtype) + " (weight_sync.dtype differs between the ranks)";
  if (w.elements != n) return std::to_string(w.elements) + " values for a model of " + std::to_string(n);
  if (w.checksums.size() != tensors.size())
    return std::to_string(w.checksums.size()) + " tensor checksums for a model of " + std::to_string(tensors.size()) +
           " tensors";
  for (const auto& t : tensors)
    if (t.offset + t.numel() > n) return "tensor " + t.name + " lies past the arena";
  return {};
}

// The message's chunk layout over n values: per chunk its first value (given: a delta's chunks
// follow the tensors; else every chunk_elements values), a sentinel n, and where each chunk's
// bytes start in the payload (a sentinel: the payload's size). "" or why the layout is corrupt.
struct ChunkLayout {
  std::vector<size_t> start, at;
  size_t chunks() const { return start.size() - 1; }
};
std::string layout_of(const Weights& w, size_t n, ChunkLayout& l, size_t payload_size) {
  const size_t C = w.chunk_elements;
  if (C == 0 && n > 0) return "chunk_elements is 0";
  auto& start = l.start;
  if (!w.chunk_starts.empty()) {
    start.assign(w.chunk_starts.begin(), w.chunk_starts.end());
    for (size_t c = 0; c < start.size(); ++c) {
      const size_t end = c + 1 < start.size() ? start[c + 1] : n;
      if ((c == 0 && start[c] != 0) || start[c] >= end || end > n || end - start[c] > C)
        return "delta chunk " + std::to_string(c) + " spans values [" + std::to_string(start[c]) + ", " +
               std::to_string(end) + "): not where the previous one ends (0 for the first), empty, past the arena's " +
               std::to_string(n) + " values or longer than chunk_elements (" + std::to_string(C) + ")";
    }
  } else {
    for (size_t a = 0; a < n; a += C) start.push_back(a);
  }
  start.push_back(n);
  const size_t chunks = l.chunks();
  if (w.chunk_bytes.size() != chunks || w.chunk_format.size() != chunks)
    return std::to_string(w.chunk_bytes.size()) + " chunks for " + std::to_string(n) + " values in " +
           std::to_string(chunks) + " chunks";
  l.at.assign(chunks + 1, 0);
  for (size_t c = 0; c < chunks; ++c) l.at[c + 1] = l.at[c] + w.chunk_bytes[c];
  if (l.at[chunks] != payload_size)
    return "the chunks add up to " + std::to_string(l.at[chunks]) + " bytes, the payload has " +
           std::to_string(payload_size);
  return {};
}

// The first tensor whose sum is not its checksum, as the reason ("" when all match).
std::string first_failure(const Weights& w, const std::vector<policy::TensorSpec>& tensors,
                          const std::vector<std::uint64_t>& sums) {
  for (size_t t = 0; t < tensors.size(); ++t)
    if (sums[t] != w.checksums[t])
      return "tensor " + tensors[t].name + " fails its checksum after version " + std::to_string(w.version) +
             (static_cast<WeightEncoding>(w.encoding) == WeightEncoding::delta
                  ? " was applied to base version " + std::to_string(w.base_version)
                  : "");
  return {};
}

WeightsApplied apply_delta(const Weights& w, const ChunkLayout& l, std::span<float> values,
                           const std::vector<policy::TensorSpec>& tensors, WeightDtype dtype);

// Whether a full payload is compressed (WeightEncoder::set_compress_full): the delta against zeros.
bool compressed_full(const Weights& w) {
  if (!w.chunk_starts.empty()) return true;
  for (auto f : w.chunk_format)
    if (f != 0) return true;
  return false;
}

WeightsApplied apply_full(const Weights& w, const ChunkLayout& l, std::span<float> values,
                          const std::vector<policy::TensorSpec>& tensors, WeightDtype dtype) {
  if (compressed_full(w)) {  // decoded into zeros and checked there; the values only once it all matches
    std::vector<float> fresh(values.size(), 0.0f);
    WeightsApplied r = apply_delta(w, l, fresh, tensors, dtype);
    if (r.status == WeightsStatus::applied) std::copy(fresh.begin(), fresh.end(), values.begin());
    return r;
  }
  const size_t W = width_of(dtype);
  const auto* src = reinterpret_cast<const std::uint8_t*>(w.payload.data());
  for (size_t c = 0; c < l.chunks(); ++c)
    if (w.chunk_format[c] != 0 || w.chunk_bytes[c] != (l.start[c + 1] - l.start[c]) * W)
      return corrupt("full chunk " + std::to_string(c) + " has " + std::to_string(w.chunk_bytes[c]) + " bytes");
  // The checksums are of the wire form, which a full payload is: checked before a value is written.
  if (auto bad = first_failure(w, tensors, payload_checksums(src, W, tensors)); !bad.empty()) return corrupt(bad);
  if (dtype == WeightDtype::bf16)
    decode_full<2>(src, values.data(), values.size());
  else
    decode_full<4>(src, values.data(), values.size());
  return {};
}

// A delta's chunk c decoded and XORed into values (hashed into st when given); run twice it
// restores them. False when it does not decode.
bool xor_chunk(const Weights& w, const char* payload, const ChunkLayout& l, size_t c, float* v, WeightDtype dtype,
               XXH3_state_t* st) {
  const size_t W = width_of(dtype);
  const size_t a = l.start[c], len = l.start[c + 1] - a;
  const bool sparse = w.chunk_format[c] & kChunkSparse;
  const size_t most = sparse ? sparse_bound(len, W) : len * W;
  size_t raw_size = 0;
  const auto* src = reinterpret_cast<const std::uint8_t*>(payload);
  const std::uint8_t* raw = chunk_raw(src + l.at[c], w.chunk_bytes[c], w.chunk_format[c] & kChunkZstd, most, &raw_size);
  if (!raw) return false;
  if (st)
    return dtype == WeightDtype::bf16 ? apply_chunk_hashed<2>(raw, raw_size, sparse, v + a, len, st)
                                      : apply_chunk_hashed<4>(raw, raw_size, sparse, v + a, len, st);
  return dtype == WeightDtype::bf16 ? apply_chunk<2>(raw, raw_size, sparse, v + a, len)
                                    : apply_chunk<4>(raw, raw_size, sparse, v + a, len);
}

// What a delta's application has done so far: the chunks applied, each tensor's hash, the chunk
// that did not decode (-1: none).
struct DeltaProgress {
  std::vector<std::uint8_t> applied;
  std::vector<std::uint64_t> sums;
  std::atomic<std::ptrdiff_t> bad_chunk{-1};
  DeltaProgress(size_t chunks, const std::vector<policy::TensorSpec>& tensors) : applied(chunks, 0) {
    sums.assign(tensors.size(), 0);
    for (size_t t = 0; t < tensors.size(); ++t)
      if (tensors[t].numel() == 0) sums[t] = empty_checksum();
  }
};

// Units [from, to) of `order` (indices into `units`): each tensor's chunks on one thread, hashed
// as they are applied.
void apply_units(const Weights& w, const char* payload, const ChunkLayout& l, const std::vector<ChunkPlan::Unit>& units,
                 const std::vector<size_t>* order, size_t from, size_t to, float* v, WeightDtype dtype,
                 DeltaProgress& done) {
  const auto U = static_cast<std::ptrdiff_t>(to - from);
#pragma omp parallel for schedule(dynamic, 1)
  for (std::ptrdiff_t i = 0; i < U; ++i) {
    const size_t at = from + static_cast<size_t>(i);
    const auto& unit = units[order ? (*order)[at] : at];
    XXH3_state_t* st = thread_scratch().hasher();
    XXH3_64bits_reset(st);
    bool ok = true;
    for (size_t c = unit.first; c < unit.last && ok; ++c) {
      ok = xor_chunk(w, payload, l, c, v, dtype, st);
      if (ok) done.applied[c] = 1;
      else done.bad_chunk.store(static_cast<std::ptrdiff_t>(c));
    }
    done.sums[unit.tensor] = XXH3_64bits_digest(st);
  }
}

// The applied chunks XORed again: back to the base version, bit for bit.
void undo_chunks(const Weights& w, const char* payload, const ChunkLayout& l, DeltaProgress& done, float* v,
                 WeightDtype dtype) {
  const auto K = static_cast<std::ptrdiff_t>(l.chunks());
#pragma omp parallel for schedule(dynamic)
  for (std::ptrdiff_t k = 0; k < K; ++k)
    if (done.applied[static_cast<size_t>(k)]) (void)xor_chunk(w, payload, l, static_cast<size_t>(k), v, dtype, nullptr);
  std::fill(done.applied.begin(), done.applied.end(), 0);
}

// Why the applied delta is not version w (a chunk that did not decode, a checksum), "" when it is.
std::string delta_failure(const Weights& w, const std::vector<policy::TensorSpec>& tensors,
                          const std::vector<std::uint64_t>& sums, const DeltaProgress& done) {
  if (done.bad_chunk.load() >= 0)
    return "delta chunk " + std::to_string(done.bad_chunk.load()) + " of version " + std::to_string(w.version) +
           " does not decode";
  return first_failure(w, tensors, sums);
}

WeightsApplied apply_delta(const Weights& w, const ChunkLayout& l, std::span<float> values,
                           const std::vector<policy::TensorSpec>& tensors, WeightDtype dtype) {
  const size_t chunks = l.chunks(), n = values.size();
  const auto K = static_cast<std::ptrdiff_t>(chunks);
  float* v = values.data();
  const char* payload = w.payload.data();
  DeltaProgress done(chunks, tensors);
  // Each tensor's chunks on one thread, hashed as they are applied, when the chunks follow the
  // tensors; else every chunk, then the checksums in a pass of their own.
  const auto units = units_of(tensors, l.start, n);
  if (!units.empty()) {
    apply_units(w, payload, l, units, nullptr, 0, units.size(), v, dtype, done);
  } else {
#pragma omp parallel for schedule(dynamic)
    for (std::ptrdiff_t k = 0; k < K; ++k) {
      if (xor_chunk(w, payload, l, static_cast<size_t>(k), v, dtype, nullptr)) done.applied[static_cast<size_t>(k)] = 1;
      else done.bad_chunk.store(k);
    }
  }
  const std::string why =
      delta_failure(w, tensors, units.empty() ? weight_checksums(values, tensors, dtype) : done.sums, done);
  if (!why.empty()) undo_chunks(w, payload, l, done, v, dtype);
  return why.empty() ? WeightsApplied{} : corrupt(why);
}

}  // namespace

WeightsApplied apply_weights(const Weights& w, std::span<float> values, const std::vector<policy::TensorSpec>& tensors,
                             WeightDtype dtype) {
  if (std::string why = refusal(w, values.size(), tensors, dtype); !why.empty()) return refused(std::move(why));
  ChunkLayout layout;
  if (std::string why = layout_of(w, values.size(), layout, w.payload.size()); !why.empty())
    return corrupt(std::move(why));
  if (static_cast<WeightEncoding>(w.encoding) == WeightEncoding::full)
    return apply_full(w, layout, values, tensors, dtype);
  return apply_delta(w, layout, values, tensors, dtype);  // in place
}

struct StreamedDelta::State {
  Weights head;  // (no payload: the chunks' layout, checksums, version)
  std::span<float> values;
  const std::vector<policy::TensorSpec>* tensors;
  WeightDtype dtype;
  ChunkLayout layout;
  std::vector<ChunkPlan::Unit> units;
  std::vector<size_t> order;  // units by the payload offset where their bytes end
  size_t next = 0;            // order[next..] not applied yet
  DeltaProgress done;
  // The worker applies what feed() made available, so that the feeder (a relay's actor) goes on
  // passing parts on meanwhile. Guarded by mu: next while the worker lives, payload, fed, stop.
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  const char* payload = nullptr;
  size_t fed = 0;
  bool stop = false;
  int threads = 1;
  State(const Weights& h, std::span<float> v, const std::vector<policy::TensorSpec>& t, WeightDtype d, size_t chunks)
      : head(h), values(v), tensors(&t), dtype(d), done(chunks, t) {}
  // The end of the units whose bytes lie within the payload's first `size` bytes.
  size_t available(size_t size) const {
    size_t to = next;
    while (to < order.size() && layout.at[units[order[to]].last] <= size) ++to;
    return to;
  }
  void run() {
    omp_set_num_threads(threads);
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || available(fed) > next; });
      if (stop) return;
      const size_t to = available(fed);
      const char* bytes = payload;
      lock.unlock();
      apply_units(head, bytes, layout, units, &order, next, to, values.data(), dtype, done);
      lock.lock();
      next = to;
    }
  }
  void join() {  // the worker stopped after the units it is applying (everything then is this thread's again)
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }
};

StreamedDelta::StreamedDelta(const Weights& head, std::span<float> values,
                             const std::vector<policy::TensorSpec>& tensors, WeightDtype dtype) {
  if (static_cast<WeightEncoding>(head.encoding) != WeightEncoding::delta ||
      !refusal(head, values.size(), tensors, dtype).empty())
    return;
  size_t payload_size = 0;  // (what the chunks add up to: the layout is checked against the payload in finish)
  for (auto b : head.chunk_bytes) payload_size += b;
  ChunkLayout layout;
  if (!layout_of(head, values.size(), layout, payload_size).empty()) return;
  auto units = units_of(tensors, layout.start, values.size());
  if (units.empty()) return;
  auto s = std::make_unique<State>(head, values, tensors, dtype, layout.chunks());
  s->layout = std::move(layout);
  s->units = std::move(units);
  s->order.resize(s->units.size());
  for (size_t u = 0; u < s->order.size(); ++u) s->order[u] = u;
  const auto end_of = [&](size_t u) { return s->layout.at[s->units[u].last]; };
  std::stable_sort(s->order.begin(), s->order.end(), [&](size_t a, size_t b) { return end_of(a) < end_of(b); });
  state_ = std::move(s);
}

StreamedDelta::~StreamedDelta() {
  if (state_) state_->join();
}

void StreamedDelta::feed(const char* payload, size_t size) {
  if (!state_) return;
  State& s = *state_;
  {
    std::lock_guard lock(s.mu);
    s.payload = payload;
    s.fed = size;
  }
  if (!s.worker.joinable()) {
    s.threads = omp_get_max_threads();  // (the feeder's, as apply_weights would use)
    s.worker = std::thread([&s] { s.run(); });
  }
  s.cv.notify_one();
}

WeightsApplied StreamedDelta::finish(const Weights& w) {
  if (!state_) return corrupt("a streamed delta finished that was never started");
  State& s = *state_;
  s.join();
  WeightsApplied r;
  if (w.payload.size() != s.layout.at.back()) {
    r = corrupt("the chunks add up to " + std::to_string(s.layout.at.back()) + " bytes, the payload has " +
                std::to_string(w.payload.size()));
  } else {
    apply_units(w, w.payload.data(), s.layout, s.units, &s.order, s.next, s.order.size(), s.values.data(), s.dtype,
                s.done);
    s.next = s.order.size();
    if (std::string why = delta_failure(w, *s.tensors, s.done.sums, s.done); !why.empty()) r = corrupt(why);
  }
  // (the applied units' bytes are the payload's first ones, as fed: order is by where they end)
  const size_t applied_end = s.next > 0 ? s.layout.at[s.units[s.order[s.next - 1]].last] : 0;
  if (r.status != WeightsStatus::applied && s.next > 0 && applied_end <= w.payload.size())
    undo_chunks(w, w.payload.data(), s.layout, s.done, s.values.data(), s.dtype);
  state_.reset();
  return r;
}

void StreamedDelta::abort(const char* payload) {
  if (!state_) return;
  State& s = *state_;
  s.join();
  if (s.next > 0) undo_chunks(s.head, payload, s.layout, s.done, s.values.data(), s.dtype);
  state_.reset();
}

}  // namespace troupe::actors
