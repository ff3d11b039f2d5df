// CURVE: keys from files; a peer with an authorized key is served, one without is refused (its
// traffic never reaches an actor), and a bad key file is a clear error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "test_messages.h"
#include "troupe/runtime/curve.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;
using namespace std::chrono_literals;

namespace {
struct Keys {
  std::string pub, sec, key;
};
Keys make_keys(const std::string& dir, const std::string& who) {
  auto kp = generate_curve_keypair();
  EXPECT_TRUE(kp.ok());
  Keys k{dir + "/" + who + ".pub", dir + "/" + who + ".key", kp->public_key};
  EXPECT_TRUE(write_curve_keypair(*kp, k.pub, k.sec).ok());
  return k;
}
SystemConfig curve_node(std::uint32_t id, const Keys& k, const std::string& authorized) {
  SystemConfig c;
  c.node_id = id;
  c.bind = "tcp://127.0.0.1:*";
  c.curve = CurveConfig{true, k.pub, k.sec, authorized};
  c.heartbeat.interval = 0ms;
  return c;
}
}  // namespace

TEST(CurveAuth, AuthorizedPeerServedUnauthorizedRefused) {
  if (!curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  std::string dir = std::filesystem::temp_directory_path() / ("troupe-curve-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Keys ka = make_keys(dir, "a"), kb = make_keys(dir, "b"), kc = make_keys(dir, "intruder");
  std::string auth = dir + "/authorized";
  std::ofstream(auth) << "# nodes of this job\n" << ka.key << "\n" << kb.key << "\n";
  auto a = ActorSystem::create(curve_node(0, ka, auth));
  ASSERT_TRUE(a.ok()) << a.error().message;
  auto b = ActorSystem::create(curve_node(1, kb, auth));
  ASSERT_TRUE(b.ok()) << b.error().message;
  auto c = ActorSystem::create(curve_node(2, kc, auth));
  ASSERT_TRUE(c.ok()) << c.error().message;
  std::atomic<int> got{0};
  ASSERT_TRUE((*a)->spawn([&] {
    auto x = std::make_unique<Actor>();
    x->handle<Ping>([&](Context& ctx, const Ping& p) {
      ++got;
      (void)ctx.reply(Pong{p.seq, "ok"});
    });
    return x;
  }, SpawnOptions().named("svc")).ok());
  std::vector<PeerInfo> t = {{0, (*a)->endpoint(), "a", (*a)->curve_public_key()},
                             {1, (*b)->endpoint(), "b", (*b)->curve_public_key()},
                             {2, (*c)->endpoint(), "intruder", (*c)->curve_public_key()}};
  ASSERT_TRUE((*a)->connect(t).ok());
  ASSERT_TRUE((*b)->connect(t).ok());
  ASSERT_TRUE((*c)->connect(t).ok());
  auto r = (*b)->ask<Pong>(ActorSystem::named(0, "svc"), Ping{1, ""}, 5s).get();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->text, "ok");
  auto r2 = (*c)->ask<Pong>(ActorSystem::named(0, "svc"), Ping{2, ""}, 500ms).get();
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.error().code, troupe::ErrorCode::timeout);
  EXPECT_EQ(got.load(), 1);  // the intruder's message never reached the actor
  std::filesystem::remove_all(dir);
}

TEST(CurveAuth, BadKeyFilesAreClearErrors) {
  if (!curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  std::string dir = std::filesystem::temp_directory_path() / ("troupe-curve2-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Keys k = make_keys(dir, "a");
  std::ofstream(dir + "/bad") << "not-a-key\n";
  auto s = ActorSystem::create(curve_node(0, k, dir + "/bad"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(dir + "/bad:1: error"), std::string::npos) << s.error().message;
  auto s2 = ActorSystem::create(curve_node(0, Keys{dir + "/missing.pub", k.sec, k.key}, dir + "/bad"));
  ASSERT_FALSE(s2.ok());
  EXPECT_NE(s2.error().message.find("missing.pub: cannot open"), std::string::npos) << s2.error().message;
  std::filesystem::remove_all(dir);
}
