// Two nodes in one process over ipc and tcp: the same actor code (send, request, names) works
// whatever the placement, bursts and long payloads arrive whole and in order, whether handlers
// run on the receive thread or on workers; malformed frames from a raw socket are dropped,
// never crash.
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
std::unique_ptr<ActorSystem> node(std::uint32_t id, const std::string& bind, bool inline_receive = true) {
  SystemConfig c;
  c.inline_receive = inline_receive;
  c.node_id = id;
  c.role = "role" + std::to_string(id);
  c.bind = bind;
  auto s = ActorSystem::create(c);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return std::move(s).value();
}
std::unique_ptr<Actor> echo() {
  auto a = std::make_unique<Actor>();
  a->handle<Ping>([](Context& ctx, const Ping& p) { (void)ctx.reply(Pong{p.seq + 1, p.text}); });
  return a;
}

void ping_pong(const std::string& bind0, const std::string& bind1, bool inline_receive = true) {
  auto a = node(0, bind0, inline_receive), b = node(1, bind1, inline_receive);
  std::vector<PeerInfo> table = {{0, a->endpoint(), "role0", ""}, {1, b->endpoint(), "role1", ""}};
  ASSERT_TRUE(a->connect(table).ok());
  ASSERT_TRUE(b->connect(table).ok());
  ASSERT_TRUE(b->spawn(echo, SpawnOptions().named("echo")).ok());
  a->set_placement({{"echo", 1}});
  auto target = a->lookup("echo");
  ASSERT_TRUE(target.ok());
  EXPECT_EQ(target->node, 1u);
  std::string big(100000, 'x');
  for (int i = 0; i < 20; ++i) {
    auto r = a->ask<Pong>(*target, Ping{std::uint64_t(i), i % 2 ? big : "small"}, 5s).get();
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->seq, std::uint64_t(i + 1));
    EXPECT_EQ(r->text.size(), i % 2 ? big.size() : 5u);
  }
  // an unknown name on the far node fails fast with an error reply, not a timeout
  auto r = a->ask<Pong>(ActorSystem::named(1, "nobody"), Ping{}, 5s).get();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no live actor"), std::string::npos) << r.error().message;
}
}  // namespace

TEST(Transport, PingPongIpc) {
  std::string dir = "/tmp/troupe-rt-" + std::to_string(::getpid());
  ping_pong("ipc://" + dir + "-a", "ipc://" + dir + "-b");
}

TEST(Transport, PingPongTcpLoopback) { ping_pong("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"); }

TEST(Transport, PingPongThroughWorkers) { ping_pong("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", /*inline_receive=*/false); }

namespace {
// Many sends in a quick burst (coalesced into batches) with long payloads (sent out of line,
// as parts of their own) among them: every message arrives, intact, in the order it was sent.
void order_and_payloads(bool inline_receive) {
  auto a = node(0, "tcp://127.0.0.1:*", inline_receive), b = node(1, "tcp://127.0.0.1:*", inline_receive);
  std::vector<PeerInfo> table = {{0, a->endpoint(), "role0", ""}, {1, b->endpoint(), "role1", ""}};
  ASSERT_TRUE(a->connect(table).ok());
  ASSERT_TRUE(b->connect(table).ok());
  constexpr int kN = 3000;
  std::atomic<int> got{0}, bad{0};
  std::mutex mu;
  std::string first_bad;
  std::uint64_t next = 0;  // the sink's alone: one message at a time
  auto sink = b->spawn([&] {
    auto x = std::make_unique<Actor>();
    x->handle<Trajectory>([&](Context&, const Trajectory& t) {
      bool long_one = t.episode % 97 == 0;
      bool ok = t.episode == next && t.tokens.size() == (long_one ? 50000u : 3u) &&
                (t.tokens.empty() || t.tokens.back() == static_cast<std::int32_t>(t.episode)) &&
                t.env.size() == (long_one ? 80000u : 1u);
      if (!ok && bad++ == 0) {
        std::lock_guard l(mu);
        first_bad = "expected episode " + std::to_string(next) + ", got " + std::to_string(t.episode) + " with " +
                    std::to_string(t.tokens.size()) + " tokens";
      }
      next = t.episode + 1;
      ++got;
    });
    return x;
  }, SpawnOptions().capacity(4096));
  ASSERT_TRUE(sink.ok());
  for (int i = 0; i < kN; ++i) {
    Trajectory t;
    t.episode = static_cast<std::uint64_t>(i);
    bool long_one = i % 97 == 0;
    t.tokens.assign(long_one ? 50000 : 3, i);
    t.env = long_one ? std::string(80000, 'e') : "e";
    ASSERT_TRUE(a->send(*sink, std::move(t)).ok()) << i;
  }
  for (int i = 0; i < 1000 && got < kN; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(got.load(), kN);
  EXPECT_EQ(bad.load(), 0) << first_bad;
}
}  // namespace

TEST(Transport, BurstsAndLongPayloadsKeepTheirOrder) { order_and_payloads(/*inline_receive=*/true); }
TEST(Transport, BurstsAndLongPayloadsKeepTheirOrderThroughWorkers) { order_and_payloads(/*inline_receive=*/false); }

TEST(Transport, RefusesNonLoopbackTcpUnlessAllowed) {
  SystemConfig c;
  c.bind = "tcp://0.0.0.0:*";
  auto s = ActorSystem::create(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("loopback"), std::string::npos) << s.error().message;
  c.bind = "udp://x";
  auto s2 = ActorSystem::create(c);
  ASSERT_FALSE(s2.ok());
  EXPECT_NE(s2.error().message.find("ipc:// or tcp://"), std::string::npos);
}

TEST(Transport, MalformedFramesAreDroppedAndTheNodeKeepsWorking) {
  auto b = node(1, "tcp://127.0.0.1:*");
  ASSERT_TRUE(b->spawn(echo, SpawnOptions().named("echo")).ok());
  zmq::context_t zctx;
  zmq::socket_t raw(zctx, zmq::socket_type::push);
  raw.connect(b->endpoint());
  raw.send(zmq::buffer(std::string("garbage")), zmq::send_flags::none);
  std::string frame = encode_frame(Ping{1, "x"}, EnvelopeHeader{});
  frame[4] = 7;  // wrong version
  raw.send(zmq::buffer(frame), zmq::send_flags::none);
  std::this_thread::sleep_for(200ms);
  // still serves well-formed traffic
  auto a = node(0, "tcp://127.0.0.1:*");
  std::vector<PeerInfo> table = {{0, a->endpoint(), "role0", ""}, {1, b->endpoint(), "role1", ""}};
  ASSERT_TRUE(a->connect(table).ok());
  ASSERT_TRUE(b->connect(table).ok());
  auto r = a->ask<Pong>(ActorSystem::named(1, "echo"), Ping{5, ""}, 5s).get();
  ASSERT_TRUE(r.ok()) << r.error().message;
  raw.close();
}
