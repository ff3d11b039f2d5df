// actors.weight_sync*: the weight-sync codec and protocol. Encode/apply round trips bit for bit
// (fp32 and bf16, several chunks, odd values); bf16 rounding to nearest even; a corrupt payload
// fails its checksum and leaves the receiver as it was, and the coordinator then sends that
// generator the full weights (sync and async); a delta against a version the generator does not
// hold is refused; full_every and joining generators get full syncs; the probe agrees in fp32 and
// bf16, and a weight corrupted behind consistent checksums (or a learner log-prob that differs) is
// a probe mismatch naming the generator, the version and the position.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <random>

#include <zstd.h>

#include "tiny_config.test.h"
#include "weight_message_checks.h"
#include "troupe/actors/roles.h"
#include "troupe/actors/weight_codec.h"
#include "troupe/actors/weight_sync.h"
#include "troupe/policy/io/safetensors.h"

using namespace troupe;
using namespace troupe::actors;
using runtime::ActorContext;
using runtime::ActorId;
using runtime::Task;

namespace {

ExperimentConfig tiny() {
  ExperimentConfig c = test_support::tiny_config();
  c.optimizer.lr = 0.01f;
  return c;
}

TrainReq sft_batch() { return test_support::tiny_sft_batch(); }

// One byte of a message's payload XORed with mask (the payload is immutable Bytes: copied, changed, put back).
void flip_payload(Weights& w, size_t at, unsigned mask) {
  std::string p = w.payload.str();
  p.at(at) = static_cast<char>(static_cast<unsigned char>(p.at(at)) ^ mask);
  w.payload = std::move(p);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// Three tensors over 2.5 chunks: a full payload's chunks cross tensor boundaries and its last one
// is short; a delta's follow the tensors (one chunk each, b's exactly a chunk long).
std::vector<policy::TensorSpec> synthetic_tensors() {
  const size_t n0 = 1000003, n1 = kWeightChunkElements, n2 = 600017;
  return {{"a.weight", {static_cast<int64_t>(n0)}, 0},
          {"b.weight", {static_cast<int64_t>(n1)}, n0},
          {"c.weight", {static_cast<int64_t>(n2)}, n0 + n1}};
}

std::vector<float> synthetic_weights(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> w(n);
  for (auto& x : w) x = d(rng);
  // values a codec could mishandle
  w[0] = std::numeric_limits<float>::quiet_NaN();
  w[1] = std::numeric_limits<float>::infinity();
  w[2] = -0.0f;
  w[3] = std::numeric_limits<float>::denorm_min();
  w[4] = std::numeric_limits<float>::max();
  return w;
}

// One AdamW-sized step: every value moves by about 1e-6.
void small_update(std::vector<float>& w, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 5; i < w.size(); ++i) w[i] += (rng() & 1) ? 1e-6f : -1e-6f;
}

}  // namespace

TEST(WeightSync, Bf16RoundsToNearestEven) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);  // a tie: to the even one
  EXPECT_EQ(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));  // a tie: up to even
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits(round_to_bf16(-0.0f)), bits(-0.0f));
  // the same rounding as the safetensors bf16 writer, on many values
  auto w = synthetic_weights(100000, 3);
  for (size_t i = 5; i < w.size(); ++i) {
    float r = round_to_bf16(w[i]);
    ASSERT_EQ(bits(r), bits(policy::io::bf16_to_float(policy::io::float_to_bf16(w[i])))) << i;
    ASSERT_EQ(bits(r) & 0xffffu, 0u);
  }
}

// Full, then deltas after small updates, applied by a receiver: bit for bit the encoder's values
// (the master as it is in fp32, rounded in bf16). In bf16 a small update changes few values and
// the delta is a small fraction of the full payload.
TEST(WeightSync, RoundTripIsBitExact) {
  const auto tensors = synthetic_tensors();
  const size_t n = tensors.back().offset + tensors.back().numel();
  for (WeightDtype dtype : {WeightDtype::fp32, WeightDtype::bf16}) {
    SCOPED_TRACE(enum_string(dtype));
    auto master = synthetic_weights(n, 1);
    WeightEncoder enc(dtype, tensors);
    std::vector<float> receiver(n, 0.0f);
    Weights w;
    enc.encode(master, 0, true, w);  // nothing encoded yet: full whatever was asked
    ASSERT_EQ(w.encoding, static_cast<int32_t>(WeightEncoding::full));
    EXPECT_EQ(w.payload.size(), n * (dtype == WeightDtype::bf16 ? 2 : 4));
    ASSERT_EQ(apply_weights(w, receiver, tensors, dtype).status, WeightsStatus::applied);
    std::vector<float> expect = master;
    round_to_dtype(expect, dtype);
    ASSERT_TRUE(same_bits(receiver, expect));
    const size_t full_bytes = w.payload.size();
    for (int64_t v = 1; v <= 3; ++v) {
      small_update(master, 10 + static_cast<uint64_t>(v));
      enc.encode(master, v, true, w);
      ASSERT_EQ(w.encoding, static_cast<int32_t>(WeightEncoding::delta));
      EXPECT_EQ(w.base_version, v - 1);
      ASSERT_EQ(apply_weights(w, receiver, tensors, dtype).status, WeightsStatus::applied);
      expect = master;
      round_to_dtype(expect, dtype);
      ASSERT_TRUE(same_bits(receiver, expect)) << "version " << v;
      ASSERT_TRUE(same_bits(receiver, enc.held()));
      EXPECT_EQ(weight_checksums(receiver, tensors, dtype), w.checksums);
      if (dtype == WeightDtype::bf16) {
        EXPECT_LT(w.changed, n / 10);
        EXPECT_LT(w.payload.size(), full_bytes / 5);
      } else {
        EXPECT_GT(w.changed, n / 2);  // a 1e-6 step moves the low bits of nearly every fp32 value
        EXPECT_LT(w.payload.size(), full_bytes);
      }
    }
    for (size_t i = 5; i < n; ++i) master[i] *= 1.5f;  // a large update: nearly every value changes
    enc.encode(master, 4, true, w);
    ASSERT_EQ(apply_weights(w, receiver, tensors, dtype).status, WeightsStatus::applied);
    EXPECT_GT(w.changed, n * 9 / 10);
    expect = master;
    round_to_dtype(expect, dtype);
    ASSERT_TRUE(same_bits(receiver, expect));
    // a chunk stored as it is (what the encoder does when zstd does not shrink it) applies the same
    {
      small_update(master, 99);
      enc.encode(master, 5, true, w);
      ASSERT_EQ(w.chunk_format[0] & 1, 1);
      std::vector<std::uint8_t> raw(ZSTD_getFrameContentSize(w.payload.data(), w.chunk_bytes[0]));
      ASSERT_EQ(ZSTD_decompress(raw.data(), raw.size(), w.payload.data(), w.chunk_bytes[0]), raw.size());
      Weights as_is = w;
      std::string stored(raw.begin(), raw.end());
      stored.append(w.payload.begin() + w.chunk_bytes[0], w.payload.end());
      as_is.payload = std::move(stored);
      as_is.chunk_bytes[0] = raw.size();
      as_is.chunk_format[0] &= ~std::uint8_t{1};
      ASSERT_EQ(apply_weights(as_is, receiver, tensors, dtype).status, WeightsStatus::applied);
      expect = master;
      round_to_dtype(expect, dtype);
      ASSERT_TRUE(same_bits(receiver, expect));
    }
    enc.encode(master, 6, false, w);  // asked for in full
    EXPECT_EQ(w.encoding, static_cast<int32_t>(WeightEncoding::full));
    ASSERT_EQ(apply_weights(w, receiver, tensors, dtype).status, WeightsStatus::applied);
    ASSERT_TRUE(same_bits(receiver, expect));
  }
}

// set_compress_full (LoRA adapters): a full payload is the delta against zeros, applied bit for
// bit (fp32 and bf16) whatever the receiver held, smaller than the raw one (zeros cost almost
// nothing, signs and exponents shrink), and a corrupt one leaves the receiver as it was.
TEST(WeightSync, CompressedFullRoundTrip) {
  const auto tensors = synthetic_tensors();
  const size_t n = tensors.back().offset + tensors.back().numel();
  for (WeightDtype dtype : {WeightDtype::fp32, WeightDtype::bf16}) {
    SCOPED_TRACE(enum_string(dtype));
    auto master = synthetic_weights(n, 3);
    std::fill(master.begin() + static_cast<std::ptrdiff_t>(tensors[1].offset),
              master.begin() + static_cast<std::ptrdiff_t>(tensors[2].offset), 0.0f);  // a fresh lora_B
    WeightEncoder enc(dtype, tensors);
    enc.set_compress_full(true);
    std::vector<float> receiver = synthetic_weights(n, 4);  // whatever it held before
    Weights w;
    enc.encode(master, 0, false, w);
    ASSERT_EQ(w.encoding, static_cast<int32_t>(WeightEncoding::full));
    EXPECT_EQ(w.base_version, -1);
    const size_t raw_bytes = n * (dtype == WeightDtype::bf16 ? 2 : 4);
    EXPECT_LT(w.payload.size(), raw_bytes * 3 / 4);
    std::vector<float> expect = master;
    round_to_dtype(expect, dtype);
    const std::vector<float> before = receiver;
    Weights bad = w;
    flip_payload(bad, bad.payload.size() / 3, 0x21);
    EXPECT_EQ(apply_weights(bad, receiver, tensors, dtype).status, WeightsStatus::checksum_failed);
    EXPECT_TRUE(same_bits(receiver, before));
    ASSERT_EQ(apply_weights(w, receiver, tensors, dtype).status, WeightsStatus::applied);
    ASSERT_TRUE(same_bits(receiver, expect));
    EXPECT_EQ(weight_checksums(receiver, tensors, dtype), w.checksums);
    // the encoder holds what it sent: the next delta applies on top
    small_update(master, 5);
    enc.encode(master, 1, true, w);
    ASSERT_EQ(w.encoding, static_cast<int32_t>(WeightEncoding::delta));
    ASSERT_EQ(apply_weights(w, receiver, tensors, dtype).status, WeightsStatus::applied);
    expect = master;
    round_to_dtype(expect, dtype);
    ASSERT_TRUE(same_bits(receiver, expect));
  }
}

// A table that does not tile the arena (a tensor that aliases part of another, as MoE experts'
// do): the delta's chunks then cut the arena evenly and the checksums are a pass of their own,
// with the same results, and a corrupt delta still leaves the receiver as it was. With a tiling
// table every chunk lies inside one tensor.
TEST(WeightSync, ChunksFollowTheTensorsOrCutTheArena) {
  auto tensors = synthetic_tensors();
  const size_t n = tensors.back().offset + tensors.back().numel();
  for (WeightDtype dtype : {WeightDtype::fp32, WeightDtype::bf16}) {
    SCOPED_TRACE(enum_string(dtype));
    {
      auto master = synthetic_weights(n, 3);
      WeightEncoder enc(dtype, tensors);
      Weights w;
      enc.encode(master, 0, false, w);
      small_update(master, 4);
      enc.encode(master, 1, true, w);
      ASSERT_EQ(w.encoding, static_cast<int32_t>(WeightEncoding::delta));
      ASSERT_EQ(w.chunk_starts.size(), 3u);  // a chunk per tensor (each has at most a chunk's values)
      for (const auto& t : tensors)
        EXPECT_NE(std::find(w.chunk_starts.begin(), w.chunk_starts.end(), t.offset), w.chunk_starts.end()) << t.name;
    }
    auto aliased = tensors;
    aliased.push_back({"b.view", {1000}, tensors[1].offset + 17});
    auto master = synthetic_weights(n, 5);
    WeightEncoder enc(dtype, aliased);
    std::vector<float> receiver(n, 0.0f);
    Weights w;
    enc.encode(master, 0, false, w);
    ASSERT_EQ(apply_weights(w, receiver, aliased, dtype).status, WeightsStatus::applied);
    for (int64_t v = 1; v <= 2; ++v) {
      small_update(master, 20 + static_cast<uint64_t>(v));
      enc.encode(master, v, true, w);
      ASSERT_EQ(w.encoding, static_cast<int32_t>(WeightEncoding::delta));
      ASSERT_EQ(w.chunk_starts.size(), (n + kWeightChunkElements - 1) / kWeightChunkElements);
      ASSERT_EQ(apply_weights(w, receiver, aliased, dtype).status, WeightsStatus::applied);
      std::vector<float> expect = master;
      round_to_dtype(expect, dtype);
      ASSERT_TRUE(same_bits(receiver, expect)) << "version " << v;
      EXPECT_EQ(weight_checksums(receiver, aliased, dtype), w.checksums);
    }
    const std::vector<float> before = receiver;
    small_update(master, 30);
    enc.encode(master, 3, true, w);
    flip_payload(w, w.payload.size() / 3, 0x21);
    auto r = apply_weights(w, receiver, aliased, dtype);
    EXPECT_EQ(r.status, WeightsStatus::checksum_failed) << r.detail;
    EXPECT_TRUE(same_bits(receiver, before));
  }
}

namespace {

// What an optimizer step does with a StepObserver (learner/optimizer.h): each range of the
// encoder's begin_prepare updated block by block (4096 values, on OpenMP threads, ranges in
// parallel), prepare_block after each; the whole arena at once when it returns no ranges.
// Returns whether the encoder prepared.
template <class Update>
bool step_with_prepare(WeightEncoder& enc, std::vector<float>& master, Update&& update) {
  const auto ranges = enc.begin_prepare(master.size());
  if (ranges.empty()) {
    update(size_t{0}, master.size());
    return false;
  }
  const auto R = static_cast<std::ptrdiff_t>(ranges.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (std::ptrdiff_t r = 0; r < R; ++r) {
    const auto [lo, hi] = ranges[static_cast<size_t>(r)];
    for (size_t b = lo; b < hi; b += 4096) {
      const size_t e = std::min(hi, b + 4096);
      update(b, e);
      enc.prepare_block(static_cast<size_t>(r), b, e, master.data());
    }
  }
  enc.end_prepare();
  return true;
}

// The same small update as small_update, for [b, e) alone.
auto small_update_of(std::vector<float>& w, uint64_t seed) {
  return [&w, seed](size_t b, size_t e) {
    for (size_t i = std::max<size_t>(b, 5); i < e; ++i) w[i] += ((seed ^ (i * 0x9E3779B97F4A7C15ull)) >> 63) ? 1e-6f : -1e-6f;
  };
}

using sync_checks::expect_same_message;  // every field the generators read

}  // namespace

// A delta prepared during the step (the encoder sees each block as the optimizer writes it) is
// the message the encoder makes from the master afterwards, bit for bit: after one step, after
// two steps before an encode (prepared again against the same base), and after the master was
// changed behind the prepared step (discarded, read again). While a step is prepared, held() is
// still the base. Nothing is prepared for fp32, before the first encode or for a table that does
// not tile the arena.
TEST(WeightSync, PreparedDeltaIsTheSameMessage) {
  const auto tensors = synthetic_tensors();
  const size_t n = tensors.back().offset + tensors.back().numel();
  auto master = synthetic_weights(n, 7);
  WeightEncoder plain(WeightDtype::bf16, tensors), prepared(WeightDtype::bf16, tensors);
  EXPECT_TRUE(prepared.begin_prepare(n).empty());  // nothing encoded yet: no base
  Weights a, b;
  plain.encode(master, 0, true, a);
  prepared.encode(master, 0, true, b);
  expect_same_message(a, b);
  std::vector<float> receiver(n, 0.0f);
  ASSERT_EQ(apply_weights(b, receiver, tensors, WeightDtype::bf16).status, WeightsStatus::applied);

  // Both encoders' message of `version`: equal, the prepared one taken from a step `took` times
  // so far, and applied by the receiver.
  auto encode_both = [&](int64_t version, bool delta, int64_t took) {
    plain.encode(master, version, delta, a);
    prepared.encode(master, version, delta, b);
    EXPECT_EQ(prepared.prepared_encodes(), took);
    EXPECT_FALSE(prepared.has_prepared());
    expect_same_message(a, b);
    return apply_weights(b, receiver, tensors, WeightDtype::bf16).status == WeightsStatus::applied;
  };

  // one step
  ASSERT_TRUE(step_with_prepare(prepared, master, small_update_of(master, 1)));
  ASSERT_TRUE(prepared.has_prepared());
  EXPECT_TRUE(same_bits(prepared.held(), plain.held()));  // still the base
  ASSERT_TRUE(encode_both(1, true, 1));
  ASSERT_EQ(b.encoding, static_cast<int32_t>(WeightEncoding::delta));
  EXPECT_GT(b.changed, 0u);
  ASSERT_TRUE(same_bits(receiver, prepared.held()));

  // two steps, one encode
  ASSERT_TRUE(step_with_prepare(prepared, master, small_update_of(master, 2)));
  ASSERT_TRUE(step_with_prepare(prepared, master, small_update_of(master, 3)));
  ASSERT_TRUE(encode_both(2, true, 2));

  // the master changed after the step (as a checkpoint load would): discarded, read again
  ASSERT_TRUE(step_with_prepare(prepared, master, small_update_of(master, 4)));
  small_update(master, 5);
  prepared.discard_prepared();
  EXPECT_FALSE(prepared.has_prepared());
  ASSERT_TRUE(encode_both(3, true, 2));

  // a prepared step, then a full sync: the full message, and the next delta from its base
  ASSERT_TRUE(step_with_prepare(prepared, master, small_update_of(master, 6)));
  ASSERT_TRUE(encode_both(4, false, 2));
  ASSERT_TRUE(step_with_prepare(prepared, master, small_update_of(master, 7)));
  ASSERT_TRUE(encode_both(5, true, 3));
  std::vector<float> expect = master;
  round_to_dtype(expect, WeightDtype::bf16);
  EXPECT_TRUE(same_bits(receiver, expect));

  // A fresh encoder whose first prepared step is a long unchanged run, then a run where every
  // value changes: the record's first growth holds the gap's 255s and a byte per change.
  {
    WeightEncoder fresh_plain(WeightDtype::bf16, tensors), fresh(WeightDtype::bf16, tensors);
    Weights fa, fb;
    auto moved = master;
    fresh_plain.encode(moved, 0, false, fa);
    fresh.encode(moved, 0, false, fb);
    const size_t to = tensors[1].offset + tensors[1].numel(), from = to - 8192;
    ASSERT_TRUE(step_with_prepare(fresh, moved, [&](size_t b0, size_t e0) {
      for (size_t i = std::max(b0, from); i < std::min(e0, to); ++i) moved[i] = moved[i] * 1.5f + 0.01f;
    }));
    fresh_plain.encode(moved, 1, true, fa);
    fresh.encode(moved, 1, true, fb);
    EXPECT_EQ(fresh.prepared_encodes(), 1);
    expect_same_message(fa, fb);
    EXPECT_GE(fb.changed, 8000u);
  }

  // nothing to prepare: fp32, or a table that does not tile the arena
  WeightEncoder fp32(WeightDtype::fp32, tensors);
  fp32.encode(master, 0, false, a);
  EXPECT_TRUE(fp32.begin_prepare(n).empty());
  auto aliased = tensors;
  aliased.push_back({"b.view", {1000}, tensors[1].offset + 17});
  WeightEncoder untiled(WeightDtype::bf16, aliased);
  untiled.encode(master, 0, false, a);
  EXPECT_TRUE(untiled.begin_prepare(n).empty());
}

// The encoder writes a later payload into the memory of an earlier one only once no message
// points into it: a message still alive keeps its bytes, whatever is encoded meanwhile.
TEST(WeightSync, PayloadMemoryIsReusedOnlyWhenFree) {
  const auto tensors = synthetic_tensors();
  const size_t n = tensors.back().offset + tensors.back().numel();
  auto master = synthetic_weights(n, 11);
  WeightEncoder enc(WeightDtype::bf16, tensors);
  auto kept = std::make_unique<Weights>();
  enc.encode(master, 0, false, *kept);
  const std::string kept_bytes = kept->payload.str();
  const char* first = kept->payload.data();
  Weights w;
  small_update(master, 12);
  enc.encode(master, 1, false, w);  // the first message is alive: new memory
  EXPECT_NE(w.payload.data(), first);
  EXPECT_TRUE(kept->payload == kept_bytes);
  const char* second = w.payload.data();
  kept.reset();
  w = Weights{};  // both gone: the next full payload reuses the kept buffer
  small_update(master, 13);
  Weights again;
  enc.encode(master, 2, false, again);
  EXPECT_EQ(again.payload.data(), second);
  std::vector<float> receiver(n, 0.0f);
  ASSERT_EQ(apply_weights(again, receiver, tensors, WeightDtype::bf16).status, WeightsStatus::applied);
  std::vector<float> expect = master;
  round_to_dtype(expect, WeightDtype::bf16);
  EXPECT_TRUE(same_bits(receiver, expect));
}

// A bf16 delta chunk whose gaps lead past the chunk's end after some changes were applied, or
// whose gap bytes run out: it does not decode, and the changes it applied are undone.
TEST(WeightSync, BadGapsAreUndone) {
  const auto tensors = synthetic_tensors();
  const size_t n = tensors.back().offset + tensors.back().numel();
  auto master = synthetic_weights(n, 6);
  WeightEncoder enc(WeightDtype::bf16, tensors);
  std::vector<float> receiver(n, 0.0f);
  Weights w;
  enc.encode(master, 0, false, w);
  ASSERT_EQ(apply_weights(w, receiver, tensors, WeightDtype::bf16).status, WeightsStatus::applied);
  small_update(master, 8);
  enc.encode(master, 1, true, w);
  ASSERT_EQ(w.chunk_format[0], 3);  // sparse, zstd
  std::vector<std::uint8_t> raw(ZSTD_getFrameContentSize(w.payload.data(), w.chunk_bytes[0]));
  ASSERT_EQ(ZSTD_decompress(raw.data(), raw.size(), w.payload.data(), w.chunk_bytes[0]), raw.size());
  std::uint32_t count = 0;
  std::memcpy(&count, raw.data(), 4);
  ASSERT_GT(count, 100u);
  const size_t gap_bytes = raw.size() - 4 - 2 * static_cast<size_t>(count);
  // chunk 0 stored as it is, with its gaps edited
  auto with_gaps = [&](auto edit) {
    Weights bad = w;
    std::vector<std::uint8_t> r = raw;
    edit(r);
    std::string stored(r.begin(), r.end());
    stored.append(w.payload.begin() + w.chunk_bytes[0], w.payload.end());
    bad.payload = std::move(stored);
    bad.chunk_bytes[0] = r.size();
    bad.chunk_format[0] = 2;
    return bad;
  };
  const std::vector<float> before = receiver;
  {  // a gap in the middle that jumps past the chunk's end
    Weights bad = with_gaps([&](std::vector<std::uint8_t>& r) {
      for (size_t g = 4 + gap_bytes / 2; g < 4 + gap_bytes / 2 + 5000; ++g) r[g] = 255;
    });
    auto r = apply_weights(bad, receiver, tensors, WeightDtype::bf16);
    EXPECT_EQ(r.status, WeightsStatus::checksum_failed);
    EXPECT_NE(r.detail.find("delta chunk 0 of version 1 does not decode"), std::string::npos) << r.detail;
    EXPECT_TRUE(same_bits(receiver, before));
  }
  {  // the last gap byte is a "go on": the gaps run out
    Weights bad = with_gaps([&](std::vector<std::uint8_t>& r) { r[4 + gap_bytes - 1] = 255; });
    auto r = apply_weights(bad, receiver, tensors, WeightDtype::bf16);
    EXPECT_EQ(r.status, WeightsStatus::checksum_failed);
    EXPECT_TRUE(same_bits(receiver, before));
  }
  {  // a count larger than the bytes hold
    Weights bad = with_gaps([&](std::vector<std::uint8_t>& r) {
      const std::uint32_t too_many = static_cast<std::uint32_t>(r.size());
      std::memcpy(r.data(), &too_many, 4);
    });
    EXPECT_EQ(apply_weights(bad, receiver, tensors, WeightDtype::bf16).status, WeightsStatus::checksum_failed);
    EXPECT_TRUE(same_bits(receiver, before));
  }
  {  // chunk starts that do not fit the arena
    Weights bad = w;
    bad.chunk_starts[1] = bad.chunk_starts[2];
    auto r = apply_weights(bad, receiver, tensors, WeightDtype::bf16);
    EXPECT_EQ(r.status, WeightsStatus::checksum_failed);
    EXPECT_NE(r.detail.find("delta chunk 0 spans values [0, 2048579)"), std::string::npos) << r.detail;
    EXPECT_TRUE(same_bits(receiver, before));
  }
  ASSERT_EQ(apply_weights(w, receiver, tensors, WeightDtype::bf16).status, WeightsStatus::applied);
  std::vector<float> expect = master;
  round_to_dtype(expect, WeightDtype::bf16);
  EXPECT_TRUE(same_bits(receiver, expect));
}

// A corrupt payload (a flipped byte, a cut chunk) fails and leaves the receiver bit for bit as it was.
TEST(WeightSync, ChecksumFailureLeavesTheWeights) {
  const auto tensors = synthetic_tensors();
  const size_t n = tensors.back().offset + tensors.back().numel();
  for (WeightDtype dtype : {WeightDtype::fp32, WeightDtype::bf16}) {
    auto master = synthetic_weights(n, 2);
    WeightEncoder enc(dtype, tensors);
    std::vector<float> receiver(n);
    Weights full, delta;
    enc.encode(master, 0, false, full);
    ASSERT_EQ(apply_weights(full, receiver, tensors, dtype).status, WeightsStatus::applied);
    const std::vector<float> before = receiver;
    small_update(master, 7);
    enc.encode(master, 1, true, delta);
    Weights bad = delta;
    flip_payload(bad, bad.payload.size() / 2, 0x5a);
    auto r = apply_weights(bad, receiver, tensors, dtype);
    EXPECT_EQ(r.status, WeightsStatus::checksum_failed) << r.detail;
    EXPECT_TRUE(same_bits(receiver, before));
    bad = delta;
    bad.payload = std::string(bad.payload.view().substr(0, bad.payload.size() - 3));
    bad.chunk_bytes.back() -= 3;
    r = apply_weights(bad, receiver, tensors, dtype);
    EXPECT_EQ(r.status, WeightsStatus::checksum_failed) << r.detail;
    EXPECT_TRUE(same_bits(receiver, before));
    bad = full;
    flip_payload(bad, 17, 1);
    r = apply_weights(bad, receiver, tensors, dtype);
    EXPECT_EQ(r.status, WeightsStatus::checksum_failed);
    EXPECT_NE(r.detail.find("a.weight fails its checksum"), std::string::npos) << r.detail;
    EXPECT_TRUE(same_bits(receiver, before));
    bad = delta;
    bad.dtype = dtype == WeightDtype::fp32 ? 1 : 0;
    EXPECT_EQ(apply_weights(bad, receiver, tensors, dtype).status, WeightsStatus::refused);
    ASSERT_EQ(apply_weights(delta, receiver, tensors, dtype).status, WeightsStatus::applied);
  }
}

// A generator refuses a delta whose base is not the version it holds, and keeps its weights and
// version; the learner's own weights apply in fp32 and bf16 with the probe passing.
TEST(WeightSync, WrongBaseIsRefused) {
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    auto cfg = tiny();
    cfg.weight_sync.dtype = *enum_from_name<WeightDtype>(dtype);
    auto l = LearnerRole::create(cfg, nullptr);
    ASSERT_TRUE(l.ok()) << l.error().message;
    auto g = Generator::create(cfg);
    ASSERT_TRUE(g.ok());
    auto w0 = (*l)->weights_for_generators(GetWeightsReq{});
    ASSERT_TRUE(w0.ok()) << w0.error().message;
    ASSERT_FALSE(w0->probe_tokens.empty());
    ASSERT_TRUE((*g)->set_weights(*w0).ok()) << (*g)->weights_ack().detail;
    EXPECT_EQ((*g)->weights_ack().status, 0);
    ASSERT_TRUE((*l)->train(sft_batch()).ok());
    auto w1 = (*l)->weights_for_generators(GetWeightsReq{0});  // delta 0 -> 1, not delivered
    ASSERT_TRUE(w1.ok());
    ASSERT_EQ(w1->encoding, static_cast<int32_t>(WeightEncoding::delta));
    ASSERT_TRUE((*l)->train(sft_batch()).ok());
    auto w2 = (*l)->weights_for_generators(GetWeightsReq{1});  // delta 1 -> 2
    ASSERT_TRUE(w2.ok());
    ASSERT_EQ(w2->base_version, 1);
    const std::vector<float> before((*g)->model().params().begin(), (*g)->model().params().end());
    Status st = (*g)->set_weights(*w2);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("a delta against version 1, but this generator holds version 0"),
              std::string::npos)
        << st.error().message;
    EXPECT_EQ((*g)->weights_ack().status, static_cast<int32_t>(WeightsStatus::refused));
    EXPECT_EQ((*g)->weights_ack().value, 0);
    EXPECT_EQ((*g)->version(), 0);
    EXPECT_TRUE(same_bits((*g)->model().params(), before));
    ASSERT_TRUE((*g)->set_weights(*w1).ok());  // in order, both apply
    ASSERT_TRUE((*g)->set_weights(*w2).ok()) << (*g)->weights_ack().detail;
    EXPECT_EQ((*g)->version(), 2);
    std::vector<float> master((*l)->weights().params);
    round_to_dtype(master, *enum_from_name<WeightDtype>(dtype));
    EXPECT_TRUE(same_bits((*g)->model().params(), master));
  }
}

// One weight corrupted behind consistent checksums: the checksums pass, the probe does not; the
// generator says where and refuses to sample until a good sync passes the probe.
TEST(WeightSync, ProbeMismatchIsDetected) {
  auto cfg = tiny();
  auto l = LearnerRole::create(cfg, nullptr);
  ASSERT_TRUE(l.ok());
  auto g = Generator::create(cfg);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE((*l)->train(sft_batch()).ok());
  auto good = (*l)->weights_for_generators(GetWeightsReq{});
  ASSERT_TRUE(good.ok());
  std::vector<float> corrupt = (*l)->weights().params;
  const auto* norm = (*g)->model().find_tensor("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  corrupt[norm->offset + 3] *= 4.0f;
  WeightEncoder enc(WeightDtype::fp32, (*g)->model().tensors());
  Weights bad;
  enc.encode(corrupt, good->version, false, bad);
  bad.probe_tokens = good->probe_tokens;
  bad.probe_logprobs = good->probe_logprobs;
  Status st = (*g)->set_weights(bad);
  ASSERT_FALSE(st.ok());
  const Ack& ack = (*g)->weights_ack();
  EXPECT_EQ(ack.status, static_cast<int32_t>(WeightsStatus::probe_mismatch));
  EXPECT_GE(ack.probe_position, 0);
  EXPECT_NE(st.error().message.find("version 1"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("position " + std::to_string(ack.probe_position)), std::string::npos)
      << st.error().message;
  GenerateReq req;
  req.prompt_tokens = {{1, 10, 11}};
  req.sampling.max_new_tokens = 2;
  auto refused = (*g)->generate(req);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("probe"), std::string::npos);
  ASSERT_TRUE((*g)->set_weights(*good).ok()) << (*g)->weights_ack().detail;
  EXPECT_TRUE((*g)->generate(req).ok());
}

// ---- the protocol, with actors: learner 0, generators, and a driver running WeightSync ----
namespace {

// A generator actor whose incoming Weights can be damaged first, as a faulty network would.
struct Damage {
  int64_t corrupt_payload_of = -1;  // flip a payload byte of this version's first message
  int64_t wrong_probe_of = -1;      // change learner 0's probe log-prob 5 of this version
};
class DamagingGenerator : public runtime::Actor {
 public:
  DamagingGenerator(std::shared_ptr<Generator> gen, Damage d) : gen_(std::move(gen)), d_(d) {
    handle<Weights>([this](runtime::Context& ctx, const Weights& in) -> Status {
      Weights w = in;
      if (w.version == d_.corrupt_payload_of && !w.payload.empty()) {
        flip_payload(w, w.payload.size() / 3, 0x81);
        d_.corrupt_payload_of = -1;  // once
      }
      if (w.version == d_.wrong_probe_of && w.probe_logprobs.size() > 5) w.probe_logprobs[5] += 1e-3f;
      (void)gen_->set_weights(w);
      return ctx.reply(gen_->weights_ack());
    });
    handle<GenerateReq>([this](runtime::Context& ctx, const GenerateReq& r) -> Status {
      TROUPE_ASSIGN_OR_RETURN(auto rep, gen_->generate(r));
      return ctx.reply(std::move(rep));
    });
  }

 private:
  std::shared_ptr<Generator> gen_;
  Damage d_;
};

struct Outcome {
  std::vector<Result<WeightSyncReport>> reports;  // the start sync, then one per update
  std::vector<int64_t> held;                      // what each generator is known to hold at the end
};

// Syncs at the start, then `updates` times: train, sync. `joins_at`: the second generator is
// only synced from that update on (it joins). Async: after each sync every generator answers a
// generation request, so its Ack has arrived before the next sync decides what to send it.
class Driver : public runtime::Actor {
 public:
  Driver(WeightSyncSection cfg, bool async, ActorId learner, std::vector<ActorId> gens, int updates, int joins_at,
         std::promise<Outcome>* done)
      : sync_(cfg, async), async_(async), learner_(learner), gens_(std::move(gens)), updates_(updates),
        joins_at_(joins_at), done_(done) {}
  void on_start(runtime::Context& ctx) override {
    ActorContext::Scope scope(here_, ctx);
    task_ = run();
    task_.start();
  }

 private:
  Task<Status> run() {
    Outcome out;
    for (int k = 0; k <= updates_; ++k) {
      if (k > 0) {
        auto trained = runtime::request<TrainRep>(here_, learner_, sft_batch(), std::chrono::seconds(60));
        auto t = co_await trained;
        if (!t.ok()) {
          out.reports.push_back(t.error());
          break;
        }
      }
      peers_.learner = learner_;
      peers_.generators.assign(gens_.begin(), gens_.begin() + (k >= joins_at_ ? 2 : 1));
      auto rep = co_await sync_.sync(here_, peers_);
      const bool ok = rep.ok();
      out.reports.push_back(std::move(rep));
      if (!ok) break;
      if (async_) {  // each generator has handled the weights (and its Ack arrived) once it answers
        for (size_t g = 0; g < peers_.generators.size(); ++g) {
          GenerateReq req;
          req.prompt_tokens = {{1, 10, 11}};
          req.sampling.max_new_tokens = 1;
          auto r = runtime::request<GenerateRep>(here_, gens_[g], req, std::chrono::seconds(60));
          (void)co_await r;
        }
      }
    }
    for (size_t g = 0; g < gens_.size(); ++g) out.held.push_back(sync_.held(g));
    here_->stop();
    done_->set_value(std::move(out));
    co_return Status{};
  }
  WeightSync sync_;
  bool async_;
  ActorId learner_;
  std::vector<ActorId> gens_;
  int updates_, joins_at_;
  std::promise<Outcome>* done_;
  WeightSyncPeers peers_;
  ActorContext here_;
  Task<Status> task_;
};

struct SyncRun {
  Outcome out;
  std::shared_ptr<LearnerRole> learner;
  std::vector<std::shared_ptr<Generator>> gens;
};

SyncRun run_syncs(const ExperimentConfig& cfg, bool async, int updates, Damage damage0, int joins_at = 0) {
  SyncRun run;
  runtime::SystemConfig sc;
  sc.threads = 2;
  auto sys = runtime::ActorSystem::create(sc);
  EXPECT_TRUE(sys.ok());
  auto l = LearnerRole::create(cfg, nullptr);
  EXPECT_TRUE(l.ok());
  run.learner = std::move(l).value();
  auto lp = run.learner;
  auto lid = (*sys)->spawn([lp]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<LearnerActor>(lp, 1); });
  std::vector<ActorId> gids;
  for (int i = 0; i < 2; ++i) {
    auto g = Generator::create(cfg);
    EXPECT_TRUE(g.ok());
    std::shared_ptr<Generator> gp = std::move(g).value();
    run.gens.push_back(gp);
    Damage d = i == 0 ? damage0 : Damage{};
    auto id = (*sys)->spawn(
        [gp, d]() -> std::unique_ptr<runtime::Actor> { return std::make_unique<DamagingGenerator>(gp, d); });
    gids.push_back(*id);
  }
  std::promise<Outcome> done;
  auto fut = done.get_future();
  auto ws = cfg.weight_sync;
  auto did = (*sys)->spawn([&, ws, gids]() -> std::unique_ptr<runtime::Actor> {
    return std::make_unique<Driver>(ws, async, *lid, gids, updates, joins_at, &done);
  });
  EXPECT_TRUE(did.ok());
  run.out = fut.get();
  (*sys)->shutdown();
  return run;
}

// Every generator holds learner 0's current weights in its dtype, bit for bit.
void expect_in_step(const SyncRun& run, const ExperimentConfig& cfg) {
  std::vector<float> master = run.learner->weights().params;
  round_to_dtype(master, cfg.weight_sync.dtype);
  for (size_t g = 0; g < run.gens.size(); ++g) {
    EXPECT_EQ(run.gens[g]->version(), run.learner->version()) << "generator " << g;
    EXPECT_TRUE(same_bits(run.gens[g]->model().params(), master)) << "generator " << g;
    EXPECT_EQ(run.out.held[g], run.learner->version()) << "generator " << g;
  }
}

}  // namespace

// Learner 0 prepares each bf16 delta in its optimizer step: the delta it sends is the one it
// makes without preparing (weight_sync.prepare_in_step false), bit for bit, and the receiver
// applies it. A checkpoint loaded after the step changes the master behind the prepared delta:
// the next delta is made from the master again, and the receiver still gets what learner 0 holds.
TEST(WeightSync, LearnerPreparesDeltasInItsSteps) {
  ExperimentConfig cfg = tiny();
  cfg.weight_sync.dtype = WeightDtype::bf16;
  ExperimentConfig plain_cfg = cfg;
  plain_cfg.weight_sync.prepare_in_step = false;
  auto l = LearnerRole::create(cfg, nullptr);
  auto plain = LearnerRole::create(plain_cfg, nullptr);
  ASSERT_TRUE(l.ok() && plain.ok());
  GetWeightsReq first;
  auto w0 = (*l)->weights_for_generators(first);
  ASSERT_TRUE(w0.ok()) << w0.error().message;
  ASSERT_TRUE((*plain)->weights_for_generators(first).ok());
  auto gen = Generator::create(cfg);
  ASSERT_TRUE(gen.ok());
  const auto tensors = (*gen)->model().tensors();  // the learner's table (the same model)
  std::vector<float> receiver((*l)->weights().params.size(), 0.0f);
  ASSERT_EQ(apply_weights(*w0, receiver, tensors, WeightDtype::bf16).status, WeightsStatus::applied);
  auto rounded_master = [&] {
    auto m = (*l)->weights().params;
    round_to_dtype(m, WeightDtype::bf16);
    return m;
  };
  const std::string dir = ::testing::TempDir() + "/prepared_delta_ckpt";
  std::filesystem::remove_all(dir);
  for (int64_t v = 1; v <= 2; ++v) {
    ASSERT_TRUE((*l)->train(sft_batch()).ok());
    ASSERT_TRUE((*plain)->train(sft_batch()).ok());
    GetWeightsReq next;
    next.base_version = v - 1;
    auto w = (*l)->weights_for_generators(next);
    auto p = (*plain)->weights_for_generators(next);
    ASSERT_TRUE(w.ok() && p.ok());
    ASSERT_EQ(w->encoding, static_cast<int32_t>(WeightEncoding::delta));
    EXPECT_EQ((*l)->prepared_deltas(), v);
    EXPECT_EQ((*plain)->prepared_deltas(), 0);
    expect_same_message(*p, *w);
    EXPECT_EQ(w->probe_logprobs, p->probe_logprobs);
    ASSERT_EQ(apply_weights(*w, receiver, tensors, WeightDtype::bf16).status, WeightsStatus::applied);
    EXPECT_TRUE(same_bits(receiver, rounded_master()));
    if (v == 1) {
      CheckpointReq save;
      save.dir = dir;
      save.step = 1;
      ASSERT_TRUE((*l)->checkpoint(save).ok());
    }
  }
  // a step, then the checkpoint of version 1 loaded over it: the prepared delta is stale
  ASSERT_TRUE((*l)->train(sft_batch()).ok());
  CheckpointReq load;
  load.load = true;
  load.dir = dir + "/step_1";
  auto loaded = (*l)->checkpoint(load);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  GetWeightsReq next;
  next.base_version = 2;
  auto w = (*l)->weights_for_generators(next);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->encoding, static_cast<int32_t>(WeightEncoding::delta));
  EXPECT_EQ((*l)->prepared_deltas(), 2);  // not taken
  ASSERT_EQ(apply_weights(*w, receiver, tensors, WeightDtype::bf16).status, WeightsStatus::applied);
  EXPECT_TRUE(same_bits(receiver, rounded_master()));
  std::filesystem::remove_all(dir);
}

// full_every 3 with deltas between; a generator that joins at update 4 gets the full weights
// first, then deltas; mode full sends every version in full.
TEST(WeightSync, FullEveryAndJoinGetFullSyncs) {
  auto cfg = tiny();
  cfg.weight_sync.full_every = 3;
  SyncRun run = run_syncs(cfg, false, 7, {}, 4);
  ASSERT_EQ(run.out.reports.size(), 8u);
  for (int v = 0; v <= 7; ++v) {
    const auto& r = run.out.reports[static_cast<size_t>(v)];
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->version, v);
    const int gens = v >= 4 ? 2 : 1;
    const bool full_due = v % 3 == 0;
    EXPECT_EQ(r->full, full_due ? gens : (v == 4 ? 1 : 0)) << "version " << v;  // v 4: the joiner
    EXPECT_EQ(r->delta, gens - r->full) << "version " << v;
    if (r->delta > 0) {
      EXPECT_GT(r->changed, 0u);
      EXPECT_GT(r->delta_bytes, 0u);
    }
  }
  expect_in_step(run, cfg);
  cfg.weight_sync.mode = WeightSyncMode::full;
  run = run_syncs(cfg, false, 2, {});
  for (const auto& r : run.out.reports) {
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->delta, 0);
    EXPECT_EQ(r->full, 2);
  }
  expect_in_step(run, cfg);
}

// A delta that arrives corrupt fails its checksum; sync mode sends that generator the full
// weights at once, async mode at its next sync; the generators end in step with learner 0.
TEST(WeightSync, ChecksumFailureGetsAFullResync) {
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    auto cfg = tiny();
    cfg.weight_sync.dtype = *enum_from_name<WeightDtype>(dtype);
    Damage d;
    d.corrupt_payload_of = 2;
    SyncRun run = run_syncs(cfg, false, 3, d);
    ASSERT_EQ(run.out.reports.size(), 4u);
    for (const auto& r : run.out.reports) ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(run.out.reports[2]->resent, 1);
    EXPECT_EQ(run.out.reports[2]->full, 1);  // the resend (the first try was a delta)
    EXPECT_EQ(run.out.reports[2]->delta, 2);
    EXPECT_EQ(run.out.reports[3]->delta, 2);  // then deltas again
    expect_in_step(run, cfg);

    run = run_syncs(cfg, true, 3, d);
    for (const auto& r : run.out.reports) ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(run.out.reports[2]->resent, 0);  // async: nothing is awaited, so nothing is resent at once
    EXPECT_EQ(run.out.reports[3]->full, 1);    // but the next sync to it is full
    EXPECT_EQ(run.out.reports[3]->delta, 1);
    expect_in_step(run, cfg);
  }
}

// Learner 0's probe log-prob differs from the generator's: the sync fails naming the generator,
// the version and the position.
TEST(WeightSync, ProbeMismatchFailsTheSync) {
  auto cfg = tiny();
  Damage d;
  d.wrong_probe_of = 2;
  SyncRun run = run_syncs(cfg, false, 3, d);
  ASSERT_EQ(run.out.reports.size(), 3u);  // version 2 ends it
  ASSERT_FALSE(run.out.reports[2].ok());
  const std::string& m = run.out.reports[2].error().message;
  EXPECT_NE(m.find("generator 0"), std::string::npos) << m;
  EXPECT_NE(m.find("version 2"), std::string::npos) << m;
  EXPECT_NE(m.find("position 5"), std::string::npos) << m;
}
