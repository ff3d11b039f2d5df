// Randomized decoder fuzzing: 100,000 mutated, truncated and random frames; the decoder
// must return a value or an Error every time (ASan/UBSan builds make any overrun fatal).
#include <gtest/gtest.h>

#include <random>

#include "test_messages.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;

TEST(EnvelopeFuzz, MutatedFramesNeverCrash) {
  ASSERT_TRUE(register_message<Trajectory>().ok());
  ASSERT_TRUE(register_message<Ping>().ok());
  std::mt19937_64 rng(1234);
  Trajectory t;
  t.tokens.assign(64, 7);
  t.logprobs.assign(64, -1.0f);
  t.env = "math";
  EnvelopeHeader h;
  h.sender = {0, 1};
  h.recipient = {1, 2};
  std::string base = encode_frame(t, h);
  int ok = 0, rejected = 0;
  for (int i = 0; i < 100000; ++i) {
    std::string f = base;
    int mode = static_cast<int>(rng() % 5);
    if (mode == 0) {  // flip random bytes anywhere
      int flips = 1 + static_cast<int>(rng() % 8);
      for (int k = 0; k < flips; ++k) f[rng() % f.size()] = static_cast<char>(rng());
    } else if (mode == 1) {  // truncate
      f.resize(rng() % f.size());
    } else if (mode == 2) {  // random bytes with a valid header prefix
      for (std::size_t k = kHeaderSize; k < f.size(); ++k) f[k] = static_cast<char>(rng());
    } else if (mode == 3) {  // entirely random, random length
      f.assign(rng() % 200, '\0');
      for (auto& c : f) c = static_cast<char>(rng());
    } else {  // payload flips keeping the length field consistent
      for (int k = 0; k < 4; ++k) f[kHeaderSize + rng() % (f.size() - kHeaderSize)] = static_cast<char>(rng());
    }
    Trajectory out;
    auto r = decode_frame(f.data(), f.size(), out);
    if (r.ok()) {
      ++ok;
      EXPECT_LE(out.tokens.size() * 4 + out.logprobs.size() * 4 + out.env.size(), f.size());
    } else {
      ++rejected;
      EXPECT_FALSE(r.error().message.empty());
    }
    Ping p;  // the same bytes read as another type must also fail cleanly
    (void)decode_frame(f.data(), f.size(), p);
  }
  EXPECT_GT(rejected, 50000);
  EXPECT_GT(ok, 0);  // some flips land in values (floats, ints) and stay valid
}

// What a receive thread does with a (mutated) batch: frame envelope after envelope with
// decode_batched_header, decode each payload, some of them as if segmented with random parts.
TEST(EnvelopeFuzz, MutatedBatchesAndSegmentedFramesNeverCrash) {
  ASSERT_TRUE(register_message<Trajectory>().ok());
  std::mt19937_64 rng(99);
  Trajectory t;
  t.tokens.assign(20, 3);
  t.env = "countdown";
  EnvelopeHeader h;
  std::string batch = encode_frame(t, h) + encode_frame(Ping{4, "p"}, h) + encode_frame(t, h);
  std::string part(kWireSegmentMin + 5, 'x');
  int framed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string f = batch;
    int flips = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < flips; ++k) f[rng() % f.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) f.resize(rng() % f.size());
    std::size_t at = 0;
    while (at < f.size()) {
      auto hh = decode_batched_header(f.data() + at, f.size() - at);
      if (!hh.ok()) break;
      ++framed;
      ASSERT_LE(at + kHeaderSize + hh->payload_size, f.size());
      Trajectory out;
      const char* body = f.data() + at + kHeaderSize;
      if (rng() % 2) {
        WireSegment segs[2] = {{part.data(), part.size() - rng() % 10}, {part.data(), rng() % part.size()}};
        (void)decode_payload(body, hh->payload_size, segs, rng() % 3, out);
      } else {
        (void)decode_payload(body, hh->payload_size, out);
      }
      at += kHeaderSize + hh->payload_size;
    }
  }
  EXPECT_GT(framed, 20000);
}

namespace {
struct Blob {  // a Bytes field between scalars
  static constexpr std::uint32_t type_id = 9012;
  static constexpr const char* type_name = "test.Blob";
  std::uint32_t a = 0;
  Bytes data;
  std::uint32_t b = 0;
  template <class A>
  void serialize(A& ar) { ar(a, data, b); }
};
class Held final : public SharedBuffer {};
}  // namespace

// Bytes decoded with an owner (shared, not copied, when long): mutated frames still decode to a
// value or an Error, a shared run always lies inside the frame, and nothing keeps a reference
// once the decoded value is gone.
TEST(EnvelopeFuzz, MutatedFramesWithSharedBytesNeverCrash) {
  std::mt19937_64 rng(7);
  Blob m{1, Bytes(std::string(kWireShareMin + 40, 'b')), 2};
  std::string base = encode_frame(m, EnvelopeHeader{});
  auto* owner = new Held;
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string f = base;
    // flips near the size tag and the end, where a lying length matters
    for (int k = 0; k < 3; ++k) {
      std::size_t at = rng() % 2 ? kHeaderSize + 4 + rng() % 8 : f.size() - 1 - rng() % 16;
      f[at] = static_cast<char>(rng());
    }
    if (rng() % 4 == 0) f.resize(kHeaderSize + rng() % (f.size() - kHeaderSize));
    {
      Blob out;
      auto st = decode_payload(f.data() + kHeaderSize, f.size() - kHeaderSize, out, owner);
      if (st.ok()) ++ok;
      if (st.ok() && out.data.is_shared()) {
        ASSERT_GE(out.data.data(), f.data());
        ASSERT_LE(out.data.data() + out.data.size(), f.data() + f.size());
      }
    }
    ASSERT_EQ(owner->use_count(), 1u);
  }
  owner->release();
  EXPECT_GT(ok, 0);
}
