// runtime.max_message: SystemConfig::max_message_bytes bounds what a node's receiving socket takes
// from a peer. A message part over it never reaches the node (libzmq drops the connection before
// allocating it; the request waiting for it times out), and the peer's next messages, sent over
// the reconnected socket, arrive as usual. A sender with the same limit refuses such a part itself.
#include <gtest/gtest.h>

#include "test_messages.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;
using namespace std::chrono_literals;

namespace {
std::unique_ptr<ActorSystem> node(std::uint32_t id, std::int64_t max_message_bytes) {
  SystemConfig c;
  c.node_id = id;
  c.role = "role" + std::to_string(id);
  c.bind = "tcp://127.0.0.1:*";
  c.max_message_bytes = max_message_bytes;
  auto s = ActorSystem::create(c);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return std::move(s).value();
}
}  // namespace

TEST(MaxMessage, OversizedMessageIsDroppedAndThePeerGoesOn) {
  constexpr std::int64_t kLimit = 64 * 1024;
  auto a = node(0, -1), b = node(1, kLimit);
  std::vector<PeerInfo> table = {{0, a->endpoint(), "role0", ""}, {1, b->endpoint(), "role1", ""}};
  ASSERT_TRUE(a->connect(table).ok());
  ASSERT_TRUE(b->connect(table).ok());
  std::atomic<std::size_t> largest{0};
  ASSERT_TRUE(b->spawn(
                   [&] {
                     auto e = std::make_unique<Actor>();
                     e->handle<Ping>([&](Context& ctx, const Ping& p) {
                       if (p.text.size() > largest) largest = p.text.size();
                       (void)ctx.reply(Pong{p.seq + 1, ""});
                     });
                     return e;
                   },
                   SpawnOptions().named("echo"))
                  .ok());
  a->set_placement({{"echo", 1}});
  auto target = a->lookup("echo");
  ASSERT_TRUE(target.ok());
  auto small = a->ask<Pong>(*target, Ping{1, std::string(1000, 's')}, 5s).get();
  ASSERT_TRUE(small.ok()) << small.error().message;
  // a run this long travels as a part of its own, larger than b accepts: dropped unread
  auto big = a->ask<Pong>(*target, Ping{2, std::string(4 * kLimit, 'b')}, 1s).get();
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, troupe::ErrorCode::timeout) << big.error().message;
  // and one just under the limit, over the reconnected socket, arrives
  for (int i = 0; i < 3; ++i) {
    auto after = a->ask<Pong>(*target, Ping{3, std::string(kLimit / 2, 'n')}, 5s).get();
    ASSERT_TRUE(after.ok()) << after.error().message;
    EXPECT_EQ(after->seq, 4u);
  }
  EXPECT_EQ(largest.load(), static_cast<std::size_t>(kLimit / 2));
}

TEST(MaxMessage, SenderRefusesAPartOverItsOwnLimit) {
  constexpr std::int64_t kLimit = 64 * 1024;
  auto a = node(0, kLimit), b = node(1, kLimit);
  std::vector<PeerInfo> table = {{0, a->endpoint(), "role0", ""}, {1, b->endpoint(), "role1", ""}};
  ASSERT_TRUE(a->connect(table).ok());
  ASSERT_TRUE(b->connect(table).ok());
  ASSERT_TRUE(b->spawn(
                   [] {
                     auto e = std::make_unique<Actor>();
                     e->handle<Ping>([](Context& ctx, const Ping& p) { (void)ctx.reply(Pong{p.seq + 1, ""}); });
                     return e;
                   },
                   SpawnOptions().named("echo"))
                  .ok());
  a->set_placement({{"echo", 1}});
  auto target = a->lookup("echo");
  ASSERT_TRUE(target.ok());
  auto big = a->ask<Pong>(*target, Ping{1, std::string(2 * kLimit, 'b')}, 5s).get();
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("over max_message_bytes 65536"), std::string::npos) << big.error().message;
  auto fine = a->ask<Pong>(*target, Ping{2, "ok"}, 5s).get();
  ASSERT_TRUE(fine.ok()) << fine.error().message;
}
