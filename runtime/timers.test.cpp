// Timers on the manual clock: one-shot, periodic, cancel; all exact.
#include <gtest/gtest.h>

#include "test_messages.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;
using namespace std::chrono_literals;

TEST(Timers, OneShotPeriodicAndCancel) {
  SystemConfig c;
  c.threads = 0;
  auto sys = std::move(ActorSystem::create(c)).value();
  std::vector<std::string> log;
  TimerId periodic = 0;
  auto a = sys->spawn([&] {
    auto x = std::make_unique<Actor>();
    x->handle<Arm>([&](Context& ctx, const Arm&) {
      ctx.after(30ms, [&](Context&) { log.push_back("once@30"); });
      TimerId dead = ctx.after(40ms, [&](Context&) { log.push_back("cancelled"); });
      ctx.cancel(dead);
      periodic = ctx.every(20ms, [&](Context&) { log.push_back("tick"); });
    });
    return x;
  });
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(sys->send(*a, Arm{}).ok());
  sys->run_until_idle();
  sys->advance(19ms);
  EXPECT_TRUE(log.empty());
  sys->advance(1ms);  // t = 20
  EXPECT_EQ(log, (std::vector<std::string>{"tick"}));
  sys->advance(40ms);  // t = 60: once@30, tick@40, tick@60
  EXPECT_EQ(log, (std::vector<std::string>{"tick", "once@30", "tick", "tick"}));
  sys->cancel_timer(periodic);
  sys->advance(100ms);
  EXPECT_EQ(log.size(), 4u);
}

TEST(Timers, StoppedActorsTimersNeverFire) {
  SystemConfig c;
  c.threads = 0;
  auto sys = std::move(ActorSystem::create(c)).value();
  int fired = 0;
  auto a = sys->spawn([&] {
    struct X : Actor {
      int* f;
      explicit X(int* p) : f(p) {}
      void on_start(Context& ctx) override { ctx.every(10ms, [this](Context&) { ++*f; }); }
    };
    return std::make_unique<X>(&fired);
  });
  ASSERT_TRUE(a.ok());
  sys->advance(25ms);
  EXPECT_EQ(fired, 2);
  sys->stop_actor(*a);
  sys->advance(100ms);
  EXPECT_EQ(fired, 2);
}
