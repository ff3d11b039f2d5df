// The weight-sync codec: how learner 0's weights become a Weights message (messages.h) and how a
// generator applies one. The generators hold their weights in a dtype (fp32: the master as is;
// bf16: each value rounded to the nearest bf16, ties to even, kept as an fp32 whose low 16 bits
// are zero, so every kernel still computes in fp32). A sync is full (every value's bits) or a delta
// (the XOR of the new bits and those of the version the receiver holds, zstd-compressed per chunk:
// bf16, where a small update changes few values, as the gaps between changed values and their
// XORs' byte planes; fp32, where it changes the low bytes of nearly all, as the byte planes of
// every XOR). A delta's chunks follow the tensors when the table tiles the arena, so each side
// hashes a tensor in the pass that encodes or applies it. Every tensor carries an xxh3-64 checksum
// of its values as the receiver must hold them; a receiver that gets anything else keeps what it had.
// The probe: log-probs of a fixed token sequence, which the generator computes with its weights
// and compares bit for bit with learner 0's (docs/weight_sync.md).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/messages.h"
#include "troupe/actors/weight_dtype.h"
#include "troupe/base/result.h"
#include "troupe/policy/model.h"

namespace troupe::actors {

// device: no payload; the values go over the weight group's broadcast (weight_group.h), the
// message carries their checksums (and the probe) as a full one would.
enum class WeightEncoding : std::int32_t { raw = 0, full = 1, delta = 2, device = 3 };
// Ack::status: what a generator did with a Weights message.
enum class WeightsStatus : std::int32_t {
  applied = 0,
  checksum_failed = 1,  // the payload did not decode to the checksums (corrupt): it keeps its weights
  refused = 2,          // not for it (a delta against a version it does not hold, another dtype or shape)
  probe_mismatch = 3,   // applied, but its probe log-probs differ from learner 0's
};

// weight_sync.dtype's YAML name (fp32 | bf16) -> the dtype; anything else is fp32 (the config
// loader has refused it already).
WeightDtype weight_dtype_of(const std::string& name);
const char* weight_dtype_name(WeightDtype d);
const char* weights_status_name(WeightsStatus s);

// x rounded to the nearest bf16 (ties to even), as an fp32; NaN stays a (quiet) NaN, infinities stay.
float round_to_bf16(float x);
// Every value of `values` in `dtype` (bf16: rounded in place; fp32: unchanged).
void round_to_dtype(std::span<float> values, WeightDtype dtype);

// Per tensor of `tensors`: the xxh3-64 of its values in wire form (fp32: their bytes; bf16: the
// high halves of their bits, two bytes each), what Weights::checksums holds.
std::vector<std::uint64_t> weight_checksums(std::span<const float> values,
                                            const std::vector<policy::TensorSpec>& tensors, WeightDtype dtype);

// Values per chunk of a payload (a delta's chunks, which follow the tensors, may be shorter): a
// chunk is the unit that is compressed (and decoded) on one thread.
inline constexpr std::uint32_t kWeightChunkElements = 1u << 20;

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
  // The values sent last (what a receiver holds once it applied them, as fp32) and their version (-1: none).
  std::vector<float> held() const;
  void held_into(std::span<float> out) const;  // the same, written into out (its size: the arena's)
  std::int64_t held_version() const { return held_version_; }

 private:
  template <int W>
  void encode_as(std::span<const float> master, std::int64_t version, bool delta, Weights& out);
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

struct WeightsApplied {
  WeightsStatus status = WeightsStatus::applied;
  std::string detail;  // why, when not applied
};
// The receiver's side: applies a full or delta message to `values` (a delta: `values` holds the
// message's base version; the caller checks that it is the one it holds) and checks every
// tensor's checksum. Anything but `applied` leaves `values` as they were.
WeightsApplied apply_weights(const Weights& w, std::span<float> values, const std::vector<policy::TensorSpec>& tensors,
                             WeightDtype dtype);

// The probe sequence for a model of `vocab_size` tokens: a fixed, spread-out sequence of ids.
std::vector<std::int32_t> probe_tokens(int vocab_size);
// log softmax (temperature 1) of each next token of `tokens` under `model` (tokens.size() - 1 values).
Result<std::vector<float>> probe_logprobs(policy::Model& model, const std::vector<std::int32_t>& tokens);
// The first index where a and b differ bit for bit (or where one ends), -1 when equal.
std::int64_t first_bit_difference(std::span<const float> a, std::span<const float> b);

}  // namespace troupe::actors
