// Envelope codec: round trips, and each malformed-frame class gets its own clear error.
#include <gtest/gtest.h>

#include "test_messages.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;

namespace {
EnvelopeHeader hdr() {
  EnvelopeHeader h;
  h.sender = {1, 7};
  h.recipient = {2, 9};
  h.correlation = 42;
  h.flags = kFlagRequest;
  return h;
}
Trajectory traj() {
  Trajectory t;
  t.episode = 5;
  t.policy_version = 3;
  t.tokens = {1, 2, 3, 4};
  t.logprobs = {-0.5f, -1.25f};
  t.reward = 1.0f;
  t.env = "countdown";
  return t;
}
}  // namespace

TEST(EnvelopeCodec, RoundTripKeepsEveryField) {
  ASSERT_TRUE(register_message<Trajectory>().ok());
  std::string f = encode_frame(traj(), hdr());
  Trajectory back;
  auto h = decode_frame(f.data(), f.size(), back);
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(back, traj());
  EXPECT_EQ(h->sender, (ActorId{1, 7}));
  EXPECT_EQ(h->recipient, (ActorId{2, 9}));
  EXPECT_EQ(h->correlation, 42u);
  EXPECT_EQ(h->flags, kFlagRequest);
  EXPECT_EQ(h->type_id, Trajectory::type_id);
}

// Empty containers write and read zero-byte runs whose data() is null: never passed to memcpy
// (undefined behaviour, which the ASan+UBSan build of scripts/sanitizers.sh turns into a failure).
TEST(EnvelopeCodec, EmptyContainersRoundTrip) {
  ASSERT_TRUE(register_message<Trajectory>().ok());
  Trajectory empty;
  empty.episode = 9;
  std::string f = encode_frame(empty, hdr());
  Trajectory back = traj();
  auto h = decode_frame(f.data(), f.size(), back);
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(back, empty);
  std::vector<WireSegment> segments;  // the segmented size pass sees the same empty runs
  EXPECT_EQ(segmented_payload_size_of(empty, segments), f.size() - kHeaderSize);
  EXPECT_TRUE(segments.empty());
}

TEST(EnvelopeCodec, BadMagic) {
  std::string f = encode_frame(traj(), hdr());
  f[0] = 'X';
  Trajectory back;
  auto h = decode_frame(f.data(), f.size(), back);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("bad magic"), std::string::npos) << h.error().message;
  EXPECT_EQ(h.error().code, troupe::ErrorCode::invalid_input);
}

TEST(EnvelopeCodec, WrongVersion) {
  std::string f = encode_frame(traj(), hdr());
  f[4] = 9;
  Trajectory back;
  auto h = decode_frame(f.data(), f.size(), back);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("version 9"), std::string::npos) << h.error().message;
}

TEST(EnvelopeCodec, TruncatedHeaderAndPayload) {
  std::string f = encode_frame(traj(), hdr());
  Trajectory back;
  auto h = decode_frame(f.data(), 10, back);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("truncated"), std::string::npos) << h.error().message;
  auto h2 = decode_frame(f.data(), f.size() - 3, back);
  ASSERT_FALSE(h2.ok());
  EXPECT_NE(h2.error().message.find("truncated"), std::string::npos) << h2.error().message;
}

TEST(EnvelopeCodec, UnknownType) {
  std::string f = encode_frame(traj(), hdr());
  std::uint32_t bogus = 123456;
  std::memcpy(&f[8], &bogus, 4);
  auto h = decode_header(f.data(), f.size());
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("unknown message type id 123456"), std::string::npos) << h.error().message;
}

TEST(EnvelopeCodec, LyingContainerSizeIsRefusedBeforeAllocating) {
  Trajectory t = traj();
  std::string f = encode_frame(t, hdr());
  // tokens' size tag sits after episode (8) + policy_version (4): claim 2^40 elements.
  std::uint64_t huge = 1ull << 40;
  std::memcpy(&f[kHeaderSize + 12], &huge, 8);
  Trajectory back;
  auto h = decode_frame(f.data(), f.size(), back);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.error().message.find("claims"), std::string::npos) << h.error().message;
}

TEST(EnvelopeCodec, TrailingBytesAreAnError) {
  Ping p{1, "x"};
  ASSERT_TRUE(register_message<Ping>().ok());
  EnvelopeHeader h = hdr();
  std::string f = encode_frame(p, h);
  f += "zz";
  std::uint32_t n = static_cast<std::uint32_t>(f.size() - kHeaderSize);
  std::memcpy(&f[36], &n, 4);
  Ping back;
  auto r = decode_frame(f.data(), f.size(), back);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("trailing"), std::string::npos) << r.error().message;
}

namespace {
struct Other {
  static constexpr std::uint32_t type_id = 9001;  // same as Ping
  template <class A>
  void serialize(A&) {}
};
}  // namespace

TEST(EnvelopeCodec, TypeIdCollisionIsReported) {
  ASSERT_TRUE(register_message<Ping>().ok());
  auto st = register_message<Other>();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("9001"), std::string::npos);
}

TEST(EnvelopeCodec, BatchedEnvelopesAreFramedOneAfterAnother) {
  ASSERT_TRUE(register_message<Ping>().ok());
  std::string batch = encode_frame(Ping{1, "one"}, hdr()) + encode_frame(Ping{2, std::string(300, 't')}, hdr());
  auto first = decode_batched_header(batch.data(), batch.size());
  ASSERT_TRUE(first.ok()) << first.error().message;
  std::size_t next = kHeaderSize + first->payload_size;
  auto second = decode_batched_header(batch.data() + next, batch.size() - next);
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_EQ(next + kHeaderSize + second->payload_size, batch.size());
  Ping back;
  ASSERT_TRUE(decode_payload(batch.data() + next + kHeaderSize, second->payload_size, back).ok());
  EXPECT_EQ(back.seq, 2u);
  // a batch cut short: its last envelope is truncated, not silently shortened
  auto cut = decode_batched_header(batch.data() + next, batch.size() - next - 1);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.error().message.find("truncated"), std::string::npos) << cut.error().message;
  // the strict decoder still wants one envelope per frame
  EXPECT_FALSE(decode_header(batch.data(), batch.size()).ok());
}

namespace {
// Long runs (a string and a float vector past kWireSegmentMin) around short fields.
Trajectory long_traj() {
  Trajectory t = traj();
  t.tokens.assign(40000, 7);  // 160 KB
  t.logprobs = {-1.5f};       // short: stays inline
  t.env = std::string(70000, 'e');
  return t;
}
}  // namespace

TEST(EnvelopeCodec, SegmentedFrameLeavesLongRunsOutOfLine) {
  ASSERT_TRUE(register_message<Trajectory>().ok());
  Trajectory t = long_traj();
  std::vector<WireSegment> segments;
  std::size_t payload = segmented_payload_size_of(t, segments);
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_EQ(segments[0].data, reinterpret_cast<const char*>(t.tokens.data()));  // the message's own memory
  EXPECT_EQ(segments[1].size, t.env.size());
  EXPECT_LT(payload, 200u);  // only the short fields and size tags
  std::string f(kHeaderSize + payload, '\0');
  write_segmented_frame(f.data(), payload, t, hdr());
  auto h = decode_header(f.data(), f.size());
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_TRUE(h->flags & kFlagSegmented);
  EXPECT_TRUE(h->flags & kFlagRequest);
  Trajectory back;
  auto st = decode_payload(f.data() + kHeaderSize, payload, segments.data(), segments.size(), back);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(back, t);
}

TEST(EnvelopeCodec, SegmentedFrameWithWrongPartsIsAnError) {
  Trajectory t = long_traj();
  std::vector<WireSegment> segments;
  std::size_t payload = segmented_payload_size_of(t, segments);
  std::string f(kHeaderSize + payload, '\0');
  write_segmented_frame(f.data(), payload, t, hdr());
  const char* body = f.data() + kHeaderSize;
  Trajectory back;
  // a missing part: the string's size tag is refused before anything is allocated
  auto missing = decode_payload(body, payload, segments.data(), 1, back);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("claims 70000"), std::string::npos) << missing.error().message;
  std::vector<WireSegment> longer = segments;
  longer[1].size += 1;  // never read: the size check comes first
  auto wrong = decode_payload(body, payload, longer.data(), longer.size(), back);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("out-of-line part 1"), std::string::npos) << wrong.error().message;
  std::vector<WireSegment> extra = segments;
  extra.push_back(segments[0]);
  auto unread = decode_payload(body, payload, extra.data(), extra.size(), back);
  ASSERT_FALSE(unread.ok());
  EXPECT_NE(unread.error().message.find("left unread"), std::string::npos) << unread.error().message;
}
