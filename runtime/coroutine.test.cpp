// runtime/coroutine.h on the deterministic scheduler (threads = 0): a Task resumed in reply
// continuations with their Context, fan-out that stays parallel, errors and timeouts as values,
// nested tasks, two coroutines of one actor meeting through a Wakeup, and a suspended Task
// destroyed before its reply arrives.
#include "troupe/runtime/coroutine.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_messages.h"  // Ping, Pong, Go

using namespace troupe;
using namespace troupe::runtime;
using namespace troupe::runtime::testing;
using namespace std::chrono_literals;

namespace {

SystemConfig deterministic() {
  SystemConfig c;
  c.threads = 0;  // run_until_idle / advance on the test's thread, manual clock
  return c;
}

// Answers Ping{n} with Pong{n + 1, name} (text "refuse": an error reply; "ignore": no answer),
// and logs each request as it arrives.
ActorId spawn_server(ActorSystem& sys, std::string name, std::vector<std::string>* log) {
  auto id = sys.spawn([name, log]() {
    auto a = std::make_unique<Actor>();
    a->handle<Ping>([name, log](Context& ctx, const Ping& q) -> Status {
      log->push_back(name + " got " + std::to_string(q.seq));
      if (q.text == "refuse") return invalid_input(name + " refuses " + std::to_string(q.seq));
      if (q.text == "ignore") return {};
      return ctx.reply(Pong{q.seq + 1, name});
    });
    return a;
  });
  EXPECT_TRUE(id.ok());
  return *id;
}

// An actor whose Go handler starts `body` as a Task; body's result lands in *out.
class Client : public Actor {
 public:
  using Body = std::function<Task<Result<std::uint64_t>>(ActorContext&)>;
  Client(Body body, std::optional<Result<std::uint64_t>>* out) : body_(std::move(body)), out_(out) {
    handle<Go>([this](Context& ctx, const Go&) {
      ActorContext::Scope scope(here_, ctx);
      task_ = wrap();
      task_.start();
    });
  }
  void drop_task() { task_ = {}; }

 private:
  Task<int> wrap() {
    *out_ = co_await body_(here_);
    co_return 0;
  }
  ActorContext here_;
  Body body_;
  std::optional<Result<std::uint64_t>>* out_;
  Task<int> task_;
};

struct Fixture {
  std::unique_ptr<ActorSystem> sys = std::move(ActorSystem::create(deterministic())).value();
  std::vector<std::string> log;
  ActorId x = spawn_server(*sys, "x", &log);
  ActorId y = spawn_server(*sys, "y", &log);
  std::optional<Result<std::uint64_t>> out;
  Client* client = nullptr;

  void run(Client::Body body) {
    auto id = sys->spawn([&]() {
      auto c = std::make_unique<Client>(body, &out);
      client = c.get();
      return c;
    });
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(sys->send(*id, Go{}).ok());
    sys->run_until_idle();
  }
};

Task<Result<std::uint64_t>> twice(ActorContext& here, ActorId x, std::vector<std::string>* log) {
  ActorId self = here->self();
  auto first = request<Pong>(here, x, Ping{1, ""}, 1s);  // (see coroutine.h: no Ping{...} inside a co_await)
  TROUPE_CO_ASSIGN_OR_RETURN(auto a, co_await first);
  log->push_back("resumed as the client: " + std::to_string(here->self() == self));
  auto second = request<Pong>(here, x, Ping{a.seq * 10, ""}, 1s);
  TROUPE_CO_ASSIGN_OR_RETURN(auto b, co_await second);
  co_return b.seq;
}

TEST(Coroutine, SequentialRequestsResumeInTheReplyContinuation) {
  Fixture f;
  f.run([&](ActorContext& here) { return twice(here, f.x, &f.log); });
  ASSERT_TRUE(f.out.has_value());
  ASSERT_TRUE(f.out->ok()) << f.out->error().message;
  EXPECT_EQ(**f.out, 21);
  EXPECT_EQ(f.log, (std::vector<std::string>{"x got 1", "resumed as the client: 1", "x got 20"}));
}

Task<Result<std::uint64_t>> fan_out(ActorContext& here, ActorId x, ActorId y, std::vector<std::string>* log) {
  auto a = request<Pong>(here, x, Ping{1, ""}, 1s);  // both sent before either is awaited
  auto b = request<Pong>(here, y, Ping{2, ""}, 1s);
  log->push_back("both sent");
  TROUPE_CO_ASSIGN_OR_RETURN(auto rb, co_await b);  // awaited in any order
  TROUPE_CO_ASSIGN_OR_RETURN(auto ra, co_await a);  // (ready already: no suspension)
  log->push_back(ra.text + rb.text);
  co_return ra.seq + rb.seq;
}

TEST(Coroutine, FanOutStaysParallel) {
  Fixture f;
  f.run([&](ActorContext& here) { return fan_out(here, f.x, f.y, &f.log); });
  ASSERT_TRUE(f.out.has_value() && f.out->ok());
  EXPECT_EQ(**f.out, 5);
  EXPECT_EQ(f.log, (std::vector<std::string>{"both sent", "x got 1", "y got 2", "xy"}));
}

Task<Result<std::uint64_t>> inner(ActorContext& here, ActorId x, std::uint64_t v, std::string text = "") {
  auto reply = request<Pong>(here, x, Ping{v, std::move(text)}, 1s);
  TROUPE_CO_ASSIGN_OR_RETURN(auto a, co_await reply);
  co_return a.seq;
}
Task<Result<std::uint64_t>> outer(ActorContext& here, ActorId x) {
  std::uint64_t sum = 0;
  for (int i = 1; i <= 3; ++i) {
    TROUPE_CO_ASSIGN_OR_RETURN(auto v, co_await inner(here, x, i));
    sum += v;
  }
  co_return sum;
}

TEST(Coroutine, NestedTasks) {
  Fixture f;
  f.run([&](ActorContext& here) { return outer(here, f.x); });
  ASSERT_TRUE(f.out.has_value() && f.out->ok());
  EXPECT_EQ(**f.out, 2 + 3 + 4);
}

TEST(Coroutine, ErrorReplyIsAValue) {
  Fixture f;
  f.run([&](ActorContext& here) { return inner(here, f.x, 5, "refuse"); });
  ASSERT_TRUE(f.out.has_value());
  ASSERT_FALSE(f.out->ok());
  EXPECT_EQ(f.out->error().code, ErrorCode::invalid_input);
  EXPECT_NE(f.out->error().message.find("x refuses 5"), std::string::npos) << f.out->error().message;
}

TEST(Coroutine, TimeoutResumesWithTheError) {
  Fixture f;
  f.run([&](ActorContext& here) { return inner(here, f.x, 1, "ignore"); });  // x never answers
  EXPECT_FALSE(f.out.has_value());
  f.sys->advance(1s);
  ASSERT_TRUE(f.out.has_value());
  ASSERT_FALSE(f.out->ok());
  EXPECT_EQ(f.out->error().code, ErrorCode::timeout);
}

// Two coroutines of one actor: the producer hands values over through `box` and a Wakeup.
struct Box {
  std::vector<std::uint64_t> items;
  Wakeup changed;
};
Task<Result<std::uint64_t>> producer(ActorContext& here, ActorId x, Box* box) {
  for (int i = 1; i <= 3; ++i) {
    auto reply = request<Pong>(here, x, Ping{static_cast<std::uint64_t>(i), ""}, 1s);
    TROUPE_CO_ASSIGN_OR_RETURN(auto a, co_await reply);
    box->items.push_back(a.seq);
    box->changed.notify_all();
  }
  co_return 0;
}
Task<Result<std::uint64_t>> consumer(ActorContext& here, ActorId x, Box* box) {
  Task<Result<std::uint64_t>> p = producer(here, x, box);
  p.start();
  std::uint64_t sum = 0;
  for (size_t taken = 0; taken < 3; ++taken) {
    while (box->items.size() <= taken) co_await box->changed.wait();
    sum += box->items[taken];
  }
  TROUPE_CO_TRY(co_await p);  // (still inside its last notify_all: it ends, then resumes us)
  co_return sum;
}

TEST(Coroutine, TwoCoroutinesOfOneActorMeetThroughAWakeup) {
  Fixture f;
  Box box;
  f.run([&](ActorContext& here) { return consumer(here, f.x, &box); });
  ASSERT_TRUE(f.out.has_value() && f.out->ok());
  EXPECT_EQ(**f.out, 2 + 3 + 4);
  EXPECT_FALSE(box.changed.has_waiters());
}

TEST(Coroutine, DestroyedTaskDropsTheLateReply) {
  Fixture f;
  f.run([&](ActorContext& here) { return inner(here, f.x, 1, "ignore"); });  // suspended: x never answers
  ASSERT_FALSE(f.out.has_value());
  f.client->drop_task();  // the frame goes; the timeout then finds nobody to resume
  f.sys->advance(2s);
  EXPECT_FALSE(f.out.has_value());
}

}  // namespace
