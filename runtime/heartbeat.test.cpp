// Heartbeats: a node that goes silent is declared down within the configured timeout; watchers
// get NodeDown naming it and its role; requests to it fail at once with peer_failed.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "test_messages.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;
using namespace std::chrono_literals;

TEST(Heartbeat, SilentPeerIsDetectedAndWatchersAreTold) {
  SystemConfig ca, cb;
  ca.node_id = 0;
  cb.node_id = 1;
  ca.role = "coordinator";
  cb.role = "learner";
  ca.bind = "tcp://127.0.0.1:*";
  cb.bind = "tcp://127.0.0.1:*";
  ca.heartbeat = cb.heartbeat = HeartbeatConfig{.interval = 20ms, .timeout = 200ms};
  auto a = std::move(ActorSystem::create(ca)).value();
  auto b = std::move(ActorSystem::create(cb)).value();
  std::vector<PeerInfo> t = {{0, a->endpoint(), "coordinator", ""}, {1, b->endpoint(), "learner", ""}};
  ASSERT_TRUE(a->connect(t).ok());
  ASSERT_TRUE(b->connect(t).ok());
  std::mutex mu;
  std::vector<std::string> notes;
  std::atomic<bool> callback{false};
  a->on_node_down([&](const NodeDown&) { callback = true; });
  auto watcher = a->spawn([&] {
    auto x = std::make_unique<Actor>();
    x->handle<Watch>([](Context& ctx, const Watch& w) { ctx.watch_node(static_cast<std::uint32_t>(w.who)); });
    x->handle<NodeDown>([&](Context&, const NodeDown& d) {
      std::lock_guard l(mu);
      notes.push_back("node " + std::to_string(d.node) + " role " + d.role + ": " + d.reason);
    });
    return x;
  });
  ASSERT_TRUE(watcher.ok());
  ASSERT_TRUE(a->send(*watcher, Watch{1}).ok());
  std::this_thread::sleep_for(400ms);  // healthy: two timeouts' worth of heartbeats
  EXPECT_FALSE(a->node_is_down(1));
  auto killed_at = std::chrono::steady_clock::now();
  b->shutdown(0ms);  // goes silent
  while (!a->node_is_down(1) && std::chrono::steady_clock::now() - killed_at < 3s) std::this_thread::sleep_for(5ms);
  auto took = std::chrono::steady_clock::now() - killed_at;
  ASSERT_TRUE(a->node_is_down(1));
  EXPECT_LT(took, 600ms);  // timeout 200 ms + one interval of slack, generously bounded
  std::this_thread::sleep_for(50ms);
  {
    std::lock_guard l(mu);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_NE(notes[0].find("node 1 role learner: no message or heartbeat"), std::string::npos) << notes[0];
  }
  EXPECT_TRUE(callback);
  auto r = a->ask<Pong>(ActorSystem::named(1, "x"), Ping{}, 5s).get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, troupe::ErrorCode::peer_failed);
  EXPECT_NE(r.error().message.find("learner"), std::string::npos);
}

TEST(Heartbeat, PendingRequestFailsWhenThePeerGoesDown) {
  SystemConfig ca, cb;
  ca.node_id = 0;
  cb.node_id = 1;
  ca.bind = cb.bind = "tcp://127.0.0.1:*";
  ca.heartbeat = cb.heartbeat = HeartbeatConfig{.interval = 20ms, .timeout = 150ms};
  auto a = std::move(ActorSystem::create(ca)).value();
  auto b = std::move(ActorSystem::create(cb)).value();
  std::vector<PeerInfo> t = {{0, a->endpoint(), "a", ""}, {1, b->endpoint(), "gen", ""}};
  ASSERT_TRUE(a->connect(t).ok());
  ASSERT_TRUE(b->connect(t).ok());
  ASSERT_TRUE(b->spawn([] {
    auto x = std::make_unique<Actor>();
    x->handle<Ping>([](Context&, const Ping&) {});  // never replies
    return x;
  }, SpawnOptions().named("mute")).ok());
  auto fut = a->ask<Pong>(ActorSystem::named(1, "mute"), Ping{}, 30s);
  std::this_thread::sleep_for(100ms);
  b->shutdown(0ms);
  ASSERT_EQ(fut.wait_for(3s), std::future_status::ready);
  auto r = fut.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, troupe::ErrorCode::peer_failed) << r.error().message;
}
