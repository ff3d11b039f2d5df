// Request/reply on the deterministic scheduler: inject, expect the reply, advance the manual
// clock, expect the timeout — exact, no sleeping.
#include <gtest/gtest.h>

#include "test_messages.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;
using namespace std::chrono_literals;

namespace {
std::unique_ptr<ActorSystem> manual_system() {
  SystemConfig c;
  c.threads = 0;
  auto s = ActorSystem::create(c);
  EXPECT_TRUE(s.ok());
  return std::move(s).value();
}

// Answers Ping with Pong, unless text == "ignore".
std::unique_ptr<Actor> echo() {
  auto a = std::make_unique<Actor>();
  a->handle<Ping>([](Context& ctx, const Ping& p) {
    if (p.text == "ignore") return;
    (void)ctx.reply(Pong{p.seq + 1, p.text});
  });
  return a;
}
}  // namespace

TEST(RequestTimeout, ReplyArrivesBeforeDeadline) {
  auto sys = manual_system();
  auto server = sys->spawn(echo, SpawnOptions().named("echo"));
  ASSERT_TRUE(server.ok());
  auto fut = sys->ask<Pong>(*server, Ping{41, "hi"}, 100ms);
  sys->run_until_idle();
  ASSERT_EQ(fut.wait_for(0s), std::future_status::ready);
  auto r = fut.get();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->seq, 42u);
}

TEST(RequestTimeout, SilentPeerTimesOutExactlyAtTheDeadline) {
  auto sys = manual_system();
  auto server = sys->spawn(echo);
  ASSERT_TRUE(server.ok());
  auto fut = sys->ask<Pong>(*server, Ping{1, "ignore"}, 100ms);
  sys->run_until_idle();
  sys->advance(99ms);
  EXPECT_EQ(fut.wait_for(0s), std::future_status::timeout);
  sys->advance(1ms);
  ASSERT_EQ(fut.wait_for(0s), std::future_status::ready);
  auto r = fut.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, troupe::ErrorCode::timeout);
  EXPECT_NE(r.error().message.find("timed out after 100 ms"), std::string::npos) << r.error().message;
}

TEST(RequestTimeout, ActorToActorCallbackRunsInTheCallersContext) {
  auto sys = manual_system();
  auto server = sys->spawn(echo, SpawnOptions().named("echo"));
  ASSERT_TRUE(server.ok());
  std::vector<std::string> log;
  auto client = sys->spawn([&] {
    auto a = std::make_unique<Actor>();
    a->handle<Go>([&](Context& ctx, const Go& g) {
      auto target = ctx.system().lookup("echo");
      ASSERT_TRUE(target.ok());
      ctx.request<Pong>(*target, Ping{7, g.text}, 50ms, [&log](Context& c2, troupe::Result<Pong> r) {
        log.push_back(r.ok() ? "pong " + std::to_string(r->seq) : "error " + r.error().message.substr(0, 30));
        EXPECT_TRUE(c2.self().valid());
      });
    });
    return a;
  });
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(sys->send(*client, Go{"a"}).ok());
  sys->run_until_idle();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0], "pong 8");
  ASSERT_TRUE(sys->send(*client, Go{"ignore"}).ok());
  sys->advance(49ms);
  EXPECT_EQ(log.size(), 1u);
  sys->advance(1ms);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[1].rfind("error runtime: request", 0), 0u) << log[1];
}

TEST(RequestTimeout, HandlerErrorAndMissingHandlerBecomeErrorReplies) {
  auto sys = manual_system();
  auto a = sys->spawn([] {
    auto x = std::make_unique<Actor>();
    x->handle<Ping>([](Context&, const Ping&) -> troupe::Status { return troupe::invalid_input("bad ping"); });
    return x;
  });
  ASSERT_TRUE(a.ok());
  auto f1 = sys->ask<Pong>(*a, Ping{}, 1s);
  auto f2 = sys->ask<Pong>(*a, Pong{}, 1s);  // no handler for Pong
  auto f3 = sys->ask<Pong>(ActorId{0, 999}, Ping{}, 1s);  // no such actor
  sys->run_until_idle();
  auto r1 = f1.get(), r2 = f2.get(), r3 = f3.get();
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.error().message, "bad ping");
  EXPECT_EQ(r1.error().code, troupe::ErrorCode::invalid_input);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.error().message.find("no handler"), std::string::npos) << r2.error().message;
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.error().message.find("no live actor"), std::string::npos) << r3.error().message;
}

TEST(RequestTimeout, BroadcastReachesEveryMember) {
  auto sys = manual_system();
  int got = 0;
  std::vector<ActorId> group;
  for (int i = 0; i < 5; ++i) {
    auto id = sys->spawn([&] {
      auto a = std::make_unique<Actor>();
      a->handle<Ping>([&](Context&, const Ping& p) { got += static_cast<int>(p.seq); });
      return a;
    });
    ASSERT_TRUE(id.ok());
    group.push_back(*id);
  }
  ASSERT_TRUE(sys->broadcast(group, Ping{2, "w"}).ok());
  sys->run_until_idle();
  EXPECT_EQ(got, 10);
}
