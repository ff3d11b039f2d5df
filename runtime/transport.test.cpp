// Two nodes in one process over ipc and tcp: the same actor code (send, request, names) works
// whatever the placement; malformed frames from a raw socket are dropped, never crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include "test_messages.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;
using namespace std::chrono_literals;

namespace {
std::unique_ptr<ActorSystem> node(std::uint32_t id, const std::string& bind, bool inline_receive = false) {
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

void ping_pong(const std::string& bind0, const std::string& bind1, bool inline_receive = false) {
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

TEST(Transport, PingPongInlineReceive) { ping_pong("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", /*inline_receive=*/true); }

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
