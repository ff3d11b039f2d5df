// Backpressure: a fast sender and a slow receiver; the receiver's queue never grows past its
// bound (blocking sends wait, try_send fails visibly), and nothing is lost.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "test_messages.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;
using namespace std::chrono_literals;

TEST(Backpressure, LocalQueueStaysWithinItsBound) {
  SystemConfig c;
  c.threads = 2;
  auto sys = std::move(ActorSystem::create(c)).value();
  std::atomic<int> got{0};
  constexpr std::size_t kCap = 16;
  auto slow = sys->spawn([&] {
    auto a = std::make_unique<Actor>();
    a->handle<Ping>([&](Context&, const Ping&) {
      std::this_thread::sleep_for(200us);
      ++got;
    });
    return a;
  }, SpawnOptions().capacity(kCap));
  ASSERT_TRUE(slow.ok());
  std::size_t max_seen = 0;
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done) {
      max_seen = std::max(max_seen, sys->mailbox_size(*slow));
      std::this_thread::yield();
    }
  });
  constexpr int kN = 1000;
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(sys->send(*slow, Ping{std::uint64_t(i), ""}).ok()) << i;
  while (got < kN) std::this_thread::sleep_for(1ms);
  done = true;
  sampler.join();
  EXPECT_EQ(got.load(), kN);
  EXPECT_LE(max_seen, kCap);
  EXPECT_LE(sys->mailbox_high_water(*slow), kCap);
  EXPECT_EQ(sys->mailbox_high_water(*slow), kCap);  // the sender really was faster
  std::printf("mailbox bound %zu, highest depth %zu, sampled max %zu\n", kCap, sys->mailbox_high_water(*slow), max_seen);
}

TEST(Backpressure, TrySendFailsVisiblyWhenFull) {
  SystemConfig c;
  c.threads = 0;  // nothing drains until we say so
  auto sys = std::move(ActorSystem::create(c)).value();
  auto a = sys->spawn([] {
    auto x = std::make_unique<Actor>();
    x->handle<Ping>([](Context&, const Ping&) {});
    return x;
  }, SpawnOptions().capacity(4).named("sink"));
  ASSERT_TRUE(a.ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(sys->send(*a, Ping{}, Overflow::fail).ok());
  auto st = sys->send(*a, Ping{}, Overflow::fail);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, troupe::ErrorCode::timeout);
  EXPECT_NE(st.error().message.find("'sink'"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("capacity 4"), std::string::npos) << st.error().message;
  sys->run_until_idle();
  EXPECT_TRUE(sys->send(*a, Ping{}, Overflow::fail).ok());
}

TEST(Backpressure, RemoteSenderIsThrottledByTheSlowReceiver) {
  SystemConfig ca, cb;
  ca.node_id = 0;
  cb.node_id = 1;
  ca.bind = cb.bind = "tcp://127.0.0.1:*";
  ca.hwm = cb.hwm = 8;
  auto a = std::move(ActorSystem::create(ca)).value();
  auto b = std::move(ActorSystem::create(cb)).value();
  std::vector<PeerInfo> t = {{0, a->endpoint(), "a", ""}, {1, b->endpoint(), "b", ""}};
  ASSERT_TRUE(a->connect(t).ok());
  ASSERT_TRUE(b->connect(t).ok());
  std::atomic<int> got{0};
  auto slow = b->spawn([&] {
    auto x = std::make_unique<Actor>();
    x->handle<Ping>([&](Context&, const Ping&) {
      std::this_thread::sleep_for(1ms);
      ++got;
    });
    return x;
  }, SpawnOptions().capacity(8).named("slow"));
  ASSERT_TRUE(slow.ok());
  constexpr int kN = 300;
  std::size_t max_depth = 0;
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(a->send(ActorSystem::named(1, "slow"), Ping{std::uint64_t(i), std::string(100, 'p')}).ok()) << i;
    max_depth = std::max(max_depth, b->mailbox_size(*slow));
  }
  while (got < kN) std::this_thread::sleep_for(1ms);
  EXPECT_LE(b->mailbox_high_water(*slow), 8u);
  EXPECT_EQ(got.load(), kN);
}
