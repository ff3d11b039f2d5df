// Bytes (bytes.h): the same wire bytes as a std::string field; long runs decoded from received
// memory are shared with it, not copied, and keep it alive; lying sizes stay clear errors; over a
// real transport a kept payload stays intact while the socket receives further messages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "test_messages.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;
using namespace std::chrono_literals;

namespace {
struct AsString {  // the same fields, once as std::string and once as Bytes
  static constexpr std::uint32_t type_id = 9010;
  static constexpr const char* type_name = "test.AsString";
  std::uint64_t seq = 0;
  std::string data;
  std::string tail;
  template <class A>
  void serialize(A& ar) { ar(seq, data, tail); }
};
struct AsBytes {
  static constexpr std::uint32_t type_id = 9011;
  static constexpr const char* type_name = "test.AsBytes";
  std::uint64_t seq = 0;
  Bytes data;
  Bytes tail;
  template <class A>
  void serialize(A& ar) { ar(seq, data, tail); }
};

// Received memory stand-in: counts whether it was destroyed.
class TestBuffer final : public SharedBuffer {
 public:
  TestBuffer(std::string bytes, std::atomic<int>* destroyed) : bytes_(std::move(bytes)), destroyed_(destroyed) {}
  ~TestBuffer() override { ++*destroyed_; }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
  std::atomic<int>* destroyed_;
};

std::string pattern(std::size_t n, std::uint64_t seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
  return s;
}

bool inside(const char* p, const std::string& mem) { return p >= mem.data() && p < mem.data() + mem.size(); }
}  // namespace

TEST(Bytes, SameWireBytesAsAString) {
  for (std::size_t n : {std::size_t{0}, std::size_t{5}, kWireShareMin + 3, kWireSegmentMin + 10}) {
    AsString s{7, pattern(n, 1), "t"};
    AsBytes b{7, Bytes(s.data), Bytes("t")};
    EXPECT_EQ(payload_size_of(s), payload_size_of(b)) << n;
    std::string fs = encode_frame(s, EnvelopeHeader{}), fb = encode_frame(b, EnvelopeHeader{});
    EXPECT_EQ(fs.substr(kHeaderSize), fb.substr(kHeaderSize)) << n;
    // each decodes what the other wrote
    AsString s2;
    AsBytes b2;
    ASSERT_TRUE(decode_payload(fb.data() + kHeaderSize, fb.size() - kHeaderSize, s2).ok());
    ASSERT_TRUE(decode_payload(fs.data() + kHeaderSize, fs.size() - kHeaderSize, b2).ok());
    EXPECT_EQ(s2.data, s.data);
    EXPECT_EQ(b2.data, s.data);
    EXPECT_FALSE(b2.data.is_shared());  // no owner: copied
    // out of line alike
    std::vector<WireSegment> ss, sb;
    EXPECT_EQ(segmented_payload_size_of(s, ss), segmented_payload_size_of(b, sb));
    ASSERT_EQ(ss.size(), sb.size());
    for (std::size_t i = 0; i < ss.size(); ++i) EXPECT_EQ(ss[i].size, sb[i].size);
  }
}

TEST(Bytes, LongRunsShareTheOwnerAndKeepItAlive) {
  std::atomic<int> destroyed{0};
  AsBytes m{3, Bytes(pattern(kWireShareMin, 2)), Bytes("short")};
  auto* buf = new TestBuffer(encode_frame(m, EnvelopeHeader{}), &destroyed);  // count 1: ours
  AsBytes out;
  ASSERT_TRUE(decode_payload(buf->bytes().data() + kHeaderSize, buf->bytes().size() - kHeaderSize, out, buf).ok());
  EXPECT_TRUE(out.data.is_shared());
  EXPECT_TRUE(inside(out.data.data(), buf->bytes()));  // not copied
  EXPECT_FALSE(out.tail.is_shared());                  // short: copied
  EXPECT_EQ(out.data, m.data);
  EXPECT_EQ(out.tail, "short");
  EXPECT_EQ(buf->use_count(), 2u);
  buf->release();  // the frame's other users are done: the Bytes keeps it
  EXPECT_EQ(destroyed.load(), 0);
  Bytes copy = out.data;  // a copy shares it too
  out = AsBytes{};
  EXPECT_EQ(destroyed.load(), 0);
  EXPECT_EQ(copy, m.data);
  Bytes moved = std::move(copy);
  copy = Bytes();
  EXPECT_EQ(destroyed.load(), 0);
  moved = Bytes("x");
  EXPECT_EQ(destroyed.load(), 1);
}

TEST(Bytes, OutOfLineRunsAreThePartsThemselves) {
  std::atomic<int> destroyed{0};
  AsBytes m{4, Bytes(pattern(kWireSegmentMin + 1, 3)), Bytes(pattern(kWireSegmentMin, 4))};
  std::vector<WireSegment> segments;
  std::size_t payload = segmented_payload_size_of(m, segments);
  ASSERT_EQ(segments.size(), 2u);
  std::string frame(kHeaderSize + payload, '\0');
  write_segmented_frame(frame.data(), payload, m, EnvelopeHeader{});
  // the received parts live in the owner's memory, as a SharedFrame's do
  auto* buf = new TestBuffer(m.data.str() + m.tail.str(), &destroyed);
  WireSegment parts[2] = {{buf->bytes().data(), m.data.size()}, {buf->bytes().data() + m.data.size(), m.tail.size()}};
  AsBytes out;
  auto st = decode_payload(frame.data() + kHeaderSize, payload, parts, 2, out, buf);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(out.data.data(), parts[0].data);
  EXPECT_EQ(out.tail.data(), parts[1].data);
  EXPECT_EQ(out.data, m.data);
  EXPECT_EQ(out.tail, m.tail);
  buf->release();
  EXPECT_EQ(destroyed.load(), 0);
  out = AsBytes{};
  EXPECT_EQ(destroyed.load(), 1);
}

TEST(Bytes, LyingSizesAreClearErrorsAndTakeNoReference) {
  std::atomic<int> destroyed{0};
  AsBytes m{5, Bytes(pattern(kWireShareMin + 100, 5)), Bytes("t")};
  std::string f = encode_frame(m, EnvelopeHeader{});
  auto* buf = new TestBuffer(f.substr(0, f.size() - 50), &destroyed);  // truncated inside the long run
  AsBytes out;
  auto st = decode_payload(buf->bytes().data() + kHeaderSize, buf->bytes().size() - kHeaderSize, out, buf);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("test.AsBytes"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("claims"), std::string::npos) << st.error().message;
  EXPECT_EQ(buf->use_count(), 1u);
  // the size tag fits, the run does not (a later field's bytes are missing)
  std::string g = f;
  std::uint64_t lie = m.data.size() + 1;
  std::memcpy(g.data() + kHeaderSize + 8, &lie, 8);
  {
    AsBytes partial;  // what a failed decode leaves is dropped with it, references included
    auto st2 = decode_payload(g.data() + kHeaderSize, g.size() - kHeaderSize, partial, buf);
    ASSERT_FALSE(st2.ok());
  }
  EXPECT_EQ(buf->use_count(), 1u);
  AsBytes out2;
  // out of line: a part of the wrong size
  AsBytes big{6, Bytes(pattern(kWireSegmentMin, 6)), Bytes("t")};
  std::vector<WireSegment> segments;
  std::size_t payload = segmented_payload_size_of(big, segments);
  std::string frame(kHeaderSize + payload, '\0');
  write_segmented_frame(frame.data(), payload, big, EnvelopeHeader{});
  std::string part = big.data.str() + "!";
  WireSegment wrong{part.data(), part.size()};
  auto st3 = decode_payload(frame.data() + kHeaderSize, payload, &wrong, 1, out2, buf);
  ASSERT_FALSE(st3.ok());
  EXPECT_NE(st3.error().message.find("out-of-line part 0"), std::string::npos) << st3.error().message;
  EXPECT_EQ(buf->use_count(), 1u);
  buf->release();
  EXPECT_EQ(destroyed.load(), 1);
}

namespace {
std::unique_ptr<ActorSystem> node(std::uint32_t id, const std::string& bind) {
  SystemConfig c;
  c.node_id = id;
  c.bind = bind;
  auto s = ActorSystem::create(c);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return std::move(s).value();
}
std::size_t size_of(std::uint64_t seq) {
  switch (seq % 3) {
    case 0: return kWireSegmentMin + seq;  // out of line: a part of its own
    case 1: return kWireShareMin + seq;    // inline, shared
    default: return 100 + seq;             // short: copied
  }
}
}  // namespace

// A receiving actor keeps every payload; the socket goes on receiving (more of them, then other
// traffic); every kept payload still holds its bytes, long ones without a copy. A malformed
// segmented frame from a raw socket is dropped on the way.
TEST(Bytes, ReceivedPayloadsOutliveFurtherMessages) {
  auto a = node(0, "tcp://127.0.0.1:*"), b = node(1, "tcp://127.0.0.1:*");
  std::vector<PeerInfo> table = {{0, a->endpoint(), "r0", ""}, {1, b->endpoint(), "r1", ""}};
  ASSERT_TRUE(a->connect(table).ok());
  ASSERT_TRUE(b->connect(table).ok());
  std::mutex mu;
  std::vector<AsBytes> kept;
  auto sink = b->spawn([&] {
    auto x = std::make_unique<Actor>();
    x->handle<AsBytes>([&](Context& ctx, const AsBytes& m) {
      {
        std::lock_guard l(mu);
        kept.push_back(m);
      }
      if (ctx.header()->flags & kFlagRequest) (void)ctx.reply(AsBytes{m.seq, m.data, Bytes("echo")});
    });
    x->handle<Ping>([](Context& ctx, const Ping& p) { (void)ctx.reply(Pong{p.seq, p.text}); });
    return x;
  }, SpawnOptions().capacity(4096));
  ASSERT_TRUE(sink.ok());

  // a frame whose out-of-line part is one byte short: dropped with a logged error
  {
    zmq::context_t zctx;
    zmq::socket_t raw(zctx, zmq::socket_type::push);
    raw.connect(b->endpoint());
    AsBytes bad{999, Bytes(pattern(kWireSegmentMin, 9)), Bytes("t")};
    std::vector<WireSegment> segments;
    std::size_t payload = segmented_payload_size_of(bad, segments);
    EnvelopeHeader h;
    h.sender = {0, 0};
    h.recipient = *sink;
    std::string frame(kHeaderSize + payload, '\0');
    write_segmented_frame(frame.data(), payload, bad, h);
    raw.send(zmq::buffer(frame), zmq::send_flags::sndmore);
    raw.send(zmq::buffer(bad.data.data(), bad.data.size() - 1), zmq::send_flags::none);
    raw.set(zmq::sockopt::linger, 1000);
    raw.close();
  }

  constexpr std::uint64_t kN = 60;
  for (std::uint64_t i = 0; i < kN; ++i) ASSERT_TRUE(a->send(*sink, AsBytes{i, Bytes(pattern(size_of(i), i)), Bytes("t")}).ok());
  // a reply carrying a long run: the asker's copy shares the reply's received message
  auto rep = a->ask<AsBytes>(*sink, AsBytes{kN, Bytes(pattern(kWireSegmentMin + 1, kN)), Bytes("t")}, 5s).get();
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  EXPECT_TRUE(rep->data.is_shared());
  EXPECT_EQ(rep->data, pattern(kWireSegmentMin + 1, kN));
  for (int i = 0; i < 200; ++i) {  // further traffic through the same sockets
    auto r = a->ask<Pong>(*sink, Ping{std::uint64_t(i), std::string(kWireShareMin, 'p')}, 5s).get();
    ASSERT_TRUE(r.ok()) << r.error().message;
  }
  std::lock_guard l(mu);
  ASSERT_EQ(kept.size(), kN + 1);  // the malformed one never reached the actor
  for (const AsBytes& m : kept) {
    std::size_t n = m.seq == kN ? kWireSegmentMin + 1 : size_of(m.seq);
    EXPECT_EQ(m.data.size(), n) << m.seq;
    EXPECT_TRUE(m.data == pattern(n, m.seq)) << m.seq;
    EXPECT_EQ(m.data.is_shared(), n >= kWireShareMin) << m.seq;
  }
  b->shutdown();
  a->shutdown();
  // the kept payloads own their memory past the systems' sockets and contexts
  for (const AsBytes& m : kept) {
    std::size_t n = m.seq == kN ? kWireSegmentMin + 1 : size_of(m.seq);
    EXPECT_TRUE(m.data == pattern(n, m.seq)) << m.seq;
  }
}
