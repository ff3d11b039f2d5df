// Mailbox: bounded, FIFO, schedules its owner exactly once per idle->busy transition.
#include <gtest/gtest.h>

#include <thread>

#include "troupe/runtime/mailbox.h"

using namespace troupe::runtime;

namespace {
Mail user(std::uint64_t corr) {
  Mail m;
  m.header.correlation = corr;
  return m;
}
auto far() { return std::chrono::steady_clock::now() + std::chrono::seconds(5); }
}  // namespace

TEST(Mailbox, FifoAndScheduleOnce) {
  Mailbox mb(8);
  auto r1 = mb.push(user(1), Overflow::fail, far());
  ASSERT_TRUE(r1.ok());
  EXPECT_TRUE(r1.value());  // idle -> scheduled
  auto r2 = mb.push(user(2), Overflow::fail, far());
  ASSERT_TRUE(r2.ok());
  EXPECT_FALSE(r2.value());
  std::vector<Mail> out;
  ASSERT_EQ(mb.pop_batch(out), 2u);
  EXPECT_EQ(out[0].header.correlation, 1u);
  EXPECT_EQ(out[1].header.correlation, 2u);
  EXPECT_FALSE(mb.finish_batch());  // idle again
  auto r3 = mb.push(user(3), Overflow::fail, far());
  EXPECT_TRUE(r3.value());
}

TEST(Mailbox, FullFailsVisiblyAndTasksBypass) {
  Mailbox mb(2);
  ASSERT_TRUE(mb.push(user(1), Overflow::fail, far()).ok());
  ASSERT_TRUE(mb.push(user(2), Overflow::fail, far()).ok());
  auto r = mb.push(user(3), Overflow::fail, far());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("capacity 2"), std::string::npos);
  Mail task;
  task.task = make_task([](Context&) {});
  EXPECT_TRUE(mb.push(std::move(task), Overflow::fail, far()).ok());  // replies/timers never deadlock
  EXPECT_EQ(mb.size(), 2u);
  EXPECT_EQ(mb.high_water(), 2u);
}

TEST(Mailbox, BlockedPushWaitsForRoomThenTimesOut) {
  Mailbox mb(1);
  ASSERT_TRUE(mb.push(user(1), Overflow::block, far()).ok());
  auto t0 = std::chrono::steady_clock::now();
  auto r = mb.push(user(2), Overflow::block, t0 + std::chrono::milliseconds(50));
  EXPECT_FALSE(r.ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(45));
  std::thread consumer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::vector<Mail> out;
    mb.pop_batch(out);
  });
  auto r2 = mb.push(user(3), Overflow::block, far());
  EXPECT_TRUE(r2.ok());
  consumer.join();
  EXPECT_EQ(mb.high_water(), 1u);
}

TEST(Mailbox, CloseWakesBlockedSenders) {
  Mailbox mb(1);
  ASSERT_TRUE(mb.push(user(1), Overflow::block, far()).ok());
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    mb.close();
  });
  auto r = mb.push(user(2), Overflow::block, far());
  EXPECT_FALSE(r.ok());
  closer.join();
}
