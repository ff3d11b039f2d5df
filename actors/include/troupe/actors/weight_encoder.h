// Learner 0's side of the weight-sync codec: its weights into a Weights message, in full or as a
// delta against the version it encoded last (which it keeps, in the generators' dtype, as the
// receivers' base), optionally prepared during the optimizer's step. Each message's checksums are
// of exactly the values a receiver holds once it applied it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/actors/weight_format.h"
#include "troupe/policy/model.h"

namespace troupe::actors {

// Learner 0's side. It keeps the values it sent last (the receivers' base for the next delta),
// in the generators' dtype.
class WeightEncoder {
 public:
  WeightEncoder(WeightDtype dtype, std::vector<policy::TensorSpec> tensors);
  ~WeightEncoder();
  // The weights of `version` (`master`: the fp32 master arena) into `out`: a delta against the
  // version encoded last when `delta` is true and one was encoded, else in full. Either way the
  // encoder then holds them as the receivers' next base. A delta takes what was prepared during
  // the optimizer's step when there is something prepared (the caller vouches that `master` is
  // what that step left, else it calls discard_prepared() first): the same message, bit for bit,
  // without reading the master again.
  void encode(std::span<const float> master, std::int64_t version, bool delta, Weights& out);

  // Preparing the next delta during the optimizer's step (learner::StepObserver forwards to
  // these): the step reads and writes every master value anyway, so each block is compared with
  // what the receivers hold, its changes recorded and its new values hashed while it is still in
  // cache. Only for bf16 (sparse deltas), once something was encoded, and with a tensor table that
  // tiles the arena; otherwise begin_prepare returns no ranges and nothing is prepared. The
  // ranges are the tensors, the largest first; prepare_block(r, begin, end, master) once
  // master[begin, end) of range r holds the step's values (each range's blocks in order, on one
  // thread; ranges on any threads); end_prepare() after the last. A second step before encode()
  // prepares again against the same base.
  std::span<const std::pair<size_t, size_t>> begin_prepare(size_t n);
  void prepare_block(size_t range, size_t begin, size_t end, const float* master);
  void end_prepare();
  // True from end_prepare() until the encode() or discard_prepared() that consumes it.
  bool has_prepared() const;
  // The master changed after the prepared step (a checkpoint load, set_params): forget what was
  // prepared; the next delta reads the master.
  void discard_prepared();
  // How many deltas encode() took from a prepared step (tests, the bench).
  std::int64_t prepared_encodes() const;
  WeightDtype dtype() const { return dtype_; }
  // Full payloads compressed (off by default): coded as the delta against zeros (a delta's chunks
  // and layouts, zstd level 3), which a generator decodes into zeros and checks before writing a
  // value. For small arenas (LoRA adapters: a few MB, milliseconds); a whole model's full sync is
  // mostly incompressible mantissa bits and stays raw.
  void set_compress_full(bool on) { compress_full_ = on; }
  // Lean memory (off by default; a sharded learner's piece, weight_pieces.h): an uncompressed full
  // payload is a view of the held copy itself (the same bytes) instead of a second buffer -- held is
  // copied aside first when a later encoding would write it while such a view is still alive --; a
  // delta whose chunks come to more than the held copy's bytes / kLeanDeltaShare is abandoned and
  // the weights encoded in full instead (bounding a delta's scratch and payload); and a delta's
  // per-chunk scratch is given back after each message. The messages are byte for byte the same
  // as without it, except that such a delta is a full message.
  static constexpr size_t kLeanDeltaShare = 16;
  void set_lean_memory(bool on) { lean_ = on; }
  // The values sent last (what a receiver holds once it applied them, as fp32) and their version (-1: none).
  std::vector<float> held() const;
  void held_into(std::span<float> out) const;  // the same, written into out (its size: the arena's)
  std::int64_t held_version() const { return held_version_; }

 private:
  template <int W>
  void encode_as(std::span<const float> master, std::int64_t version, bool delta, Weights& out);
  // Whether a delta of n values comes from the step's prepared record (bf16); what was prepared
  // and is not used is undone (a delta from the master) or dropped (a full encoding rewrites held).
  bool use_prepared(bool delta, size_t n);
  // A full payload (held becomes master's wire form) / a delta's chunks, into out.
  template <int W>
  void encode_full_into(const float* master, size_t n, Weights& out);
  // Returns false (held partly rewritten, out unfinished) when lean memory abandons the delta.
  template <int W>
  bool encode_delta_into(const float* master, size_t n, bool from_prepared, Weights& out, int level = 0);
  bool compress_full_ = false;
  bool lean_ = false;
  // Lean memory: counts the views of the held copy that full payloads are (HeldViews, weight_encoder.cpp).
  struct HeldViews;
  HeldViews* held_views_ = nullptr;
  void detach_held();  // held copied aside when a view of it is alive, before it is written
  WeightDtype dtype_;
  std::vector<policy::TensorSpec> tensors_;
  // What was sent last, in wire form (the one the dtype uses): half the memory traffic of fp32
  // copies for bf16, and the bytes the checksums are of.
  std::vector<std::uint16_t> held16_;
  std::vector<std::uint32_t> held32_;
  std::int64_t held_version_ = -1;
  struct Frames;  // the compressed chunks' scratch, kept between calls
  std::unique_ptr<Frames> frames_;
  // What a step prepared: per chunk its changes (gaps and XORs), per tensor its checksum. While
  // something is prepared, held16_ already holds the step's values (written in the same pass);
  // the recorded XORs take it back to the base (held_into, discard_prepared).
  struct Prepared;
  std::unique_ptr<Prepared> prepared_;
  void undo_prepared();  // held16_ back to the base, bit for bit
};

}  // namespace troupe::actors
