// Supervision on the deterministic scheduler: restart with backoff under a policy, escalate to
// the supervisor when exhausted, ActorDown to monitors; messages sent meanwhile are kept.
#include <gtest/gtest.h>

#include "test_messages.h"

using namespace troupe::runtime;
using namespace troupe::runtime::testing;
using namespace std::chrono_literals;

namespace {
struct Counters {
  int starts = 0;
  int pings = 0;
  std::vector<std::string> down;
  std::vector<std::string> escalated;
};
std::unique_ptr<Actor> fragile(Counters* c) {
  struct F : Actor {
    Counters* c;
    explicit F(Counters* p) : c(p) {
      handle<Crash>([](Context&, const Crash&) { throw std::runtime_error("boom"); });
      handle<Ping>([this](Context&, const Ping&) { ++c->pings; });
    }
    void on_start(Context&) override { ++c->starts; }
  };
  return std::make_unique<F>(c);
}
}  // namespace

TEST(Supervision, RestartsWithBackoffThenEscalates) {
  SystemConfig cfg;
  cfg.threads = 0;
  auto sys = std::move(ActorSystem::create(cfg)).value();
  Counters k;
  sys->on_escalation([&](const troupe::Error& e) { k.escalated.push_back(e.message); });
  // The supervisor: a plain actor that monitors its child; when the child gives up it fails too.
  auto sup = sys->spawn([&] {
    auto a = std::make_unique<Actor>();
    a->handle<ActorDown>([&](Context&, const ActorDown& d) { k.down.push_back(d.name); });
    return a;
  }, SpawnOptions().named("sup"));
  ASSERT_TRUE(sup.ok());
  RestartPolicy pol{.max_restarts = 2, .window = 1s, .backoff_initial = 10ms, .backoff_max = 100ms};
  auto child = sys->spawn([&] { return fragile(&k); }, SpawnOptions().named("child").restart_with(pol).supervised_by(*sup));
  ASSERT_TRUE(child.ok());
  sys->run_until_idle();
  // watch the child from the supervisor
  ASSERT_TRUE(sys->send(*sup, Ping{}).ok());  // (no handler; logged, harmless)
  sys->run_until_idle();
  EXPECT_EQ(k.starts, 1);

  ASSERT_TRUE(sys->send(*child, Crash{}).ok());
  ASSERT_TRUE(sys->send(*child, Ping{}).ok());  // queued while the child is down
  sys->run_until_idle();
  EXPECT_EQ(k.starts, 1);
  EXPECT_EQ(k.pings, 0);
  sys->advance(9ms);
  EXPECT_EQ(k.starts, 1);
  sys->advance(1ms);  // first backoff: 10 ms
  EXPECT_EQ(k.starts, 2);
  EXPECT_EQ(k.pings, 1);  // the queued message survived the restart

  ASSERT_TRUE(sys->send(*child, Crash{}).ok());
  sys->run_until_idle();
  sys->advance(19ms);
  EXPECT_EQ(k.starts, 2);
  sys->advance(1ms);  // second backoff doubles: 20 ms
  EXPECT_EQ(k.starts, 3);

  ASSERT_TRUE(sys->send(*child, Crash{}).ok());  // third failure within 1 s: exhausted
  sys->run_until_idle();
  sys->advance(500ms);
  EXPECT_EQ(k.starts, 3);
  EXPECT_FALSE(sys->send(*child, Ping{}).ok());  // stopped for good
  // the supervisor was failed in turn (it has no policy), and it has no supervisor: escalation
  ASSERT_EQ(k.escalated.size(), 1u);
  EXPECT_NE(k.escalated[0].find("child 'child'"), std::string::npos) << k.escalated[0];
  EXPECT_NE(k.escalated[0].find("exhausted its restart policy (2 restarts within 1000 ms)"), std::string::npos) << k.escalated[0];
  EXPECT_NE(k.escalated[0].find("boom"), std::string::npos);
}

TEST(Supervision, WindowForgetsOldFailures) {
  SystemConfig cfg;
  cfg.threads = 0;
  auto sys = std::move(ActorSystem::create(cfg)).value();
  Counters k;
  RestartPolicy pol{.max_restarts = 1, .window = 100ms, .backoff_initial = 1ms, .backoff_max = 1ms};
  auto child = sys->spawn([&] { return fragile(&k); }, SpawnOptions().restart_with(pol));
  ASSERT_TRUE(child.ok());
  for (int i = 0; i < 5; ++i) {  // one failure per 200 ms never exhausts a 1-per-100 ms policy
    ASSERT_TRUE(sys->send(*child, Crash{}).ok()) << i;
    sys->advance(200ms);
  }
  EXPECT_EQ(k.starts, 6);
}

TEST(Supervision, MonitorGetsActorDown) {
  SystemConfig cfg;
  cfg.threads = 0;
  auto sys = std::move(ActorSystem::create(cfg)).value();
  Counters k;
  auto child = sys->spawn([&] { return fragile(&k); }, SpawnOptions().named("victim"));
  ASSERT_TRUE(child.ok());
  auto w = sys->spawn([&] {
    auto a = std::make_unique<Actor>();
    a->handle<Watch>([](Context& ctx, const Watch& m) { ctx.monitor(ActorId::unpack(m.who)); });
    a->handle<ActorDown>([&](Context&, const ActorDown& d) { k.down.push_back(d.name + ": " + d.reason); });
    return a;
  });
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(sys->send(*w, Watch{child->packed()}).ok());
  sys->run_until_idle();
  ASSERT_TRUE(sys->send(*child, Crash{}).ok());  // no restart policy: stops at once
  sys->run_until_idle();
  ASSERT_EQ(k.down.size(), 1u);
  EXPECT_NE(k.down[0].find("victim: actor 'victim'"), std::string::npos) << k.down[0];
}
