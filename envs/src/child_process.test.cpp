// ChildProcess: start with the stderr log, exit status and tail, stop with a grace period (a whole
// process group with own_group), a command that cannot start, a descriptor as stdin and stdout.
#include "child_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "troupe/base/clock.h"

using troupe::envs::detail::ChildOptions;
using troupe::envs::detail::ChildProcess;
using troupe::envs::detail::describe_wait_status;

namespace {

std::string temp_log(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("troupe-child-test-") + std::to_string(::getpid()) + "-" + name + ".log"))
      .string();
}

// Gone: no such process, or a zombie nobody has reaped yet (killed all the same).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_text, name, state;
  stat >> pid_text >> name >> state;
  return state == "Z";
}

bool wait_dead(ChildProcess& c, double seconds) {
  const double until = troupe::mono_seconds() + seconds;
  while (c.alive()) {
    if (troupe::mono_seconds() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace

TEST(ChildProcess, ExitStatusEnvironmentAndLogTail) {
  ChildProcess c;
  ChildOptions o;
  o.argv = {"sh", "-c", "echo \"value=$TROUPE_CHILD_TEST\" >&2; exit 3"};
  o.env = {{"TROUPE_CHILD_TEST", "set"}};
  o.log_path = temp_log("exit");
  ASSERT_TRUE(c.start(o, "test").ok());
  EXPECT_GT(c.pid(), 0);
  ASSERT_TRUE(wait_dead(c, 10));
  EXPECT_EQ(c.pid(), -1);
  EXPECT_TRUE(WIFEXITED(c.exit_status()));
  EXPECT_EQ(describe_wait_status(c.exit_status()), "exited with status 3");
  EXPECT_EQ(c.log_tail(), " (stderr: value=set)");
  EXPECT_EQ(c.command_text(), "sh -c echo \"value=$TROUPE_CHILD_TEST\" >&2; exit 3");
}

TEST(ChildProcess, StopKillsAfterGraceAndRemovesLog) {
  const std::string log = temp_log("stop");
  {
    ChildProcess c;
    ChildOptions o;
    o.argv = {"sh", "-c", "trap '' TERM; echo started >&2; while :; do sleep 0.05; done"};
    o.log_path = log;
    ASSERT_TRUE(c.start(o, "test").ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const double t0 = troupe::mono_seconds();
    c.stop(0.3, SIGTERM);  // ignored: SIGKILL after the grace period
    EXPECT_GE(troupe::mono_seconds() - t0, 0.25);
    EXPECT_EQ(c.pid(), -1);
    EXPECT_FALSE(c.alive());
    EXPECT_TRUE(WIFSIGNALED(c.exit_status()));
    EXPECT_EQ(WTERMSIG(c.exit_status()), SIGKILL);
    EXPECT_NE(describe_wait_status(c.exit_status()).find("killed by signal 9"), std::string::npos);
    EXPECT_TRUE(std::filesystem::exists(log));
  }
  EXPECT_FALSE(std::filesystem::exists(log));
}

TEST(ChildProcess, OwnGroupStopsGrandchildren) {
  ChildProcess c;
  ChildOptions o;
  const std::string pid_file = temp_log("grandchild");
  o.argv = {"sh", "-c", "sleep 30 & echo $! > " + pid_file + "; wait"};
  o.own_group = true;
  o.stdout_to_null = true;
  ASSERT_TRUE(c.start(o, "test").ok());
  pid_t grandchild = 0;
  for (int i = 0; i < 200 && grandchild <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    FILE* f = std::fopen(pid_file.c_str(), "r");
    if (f) {
      if (std::fscanf(f, "%d", &grandchild) != 1) grandchild = 0;
      std::fclose(f);
    }
  }
  ASSERT_GT(grandchild, 0);
  c.stop(2.0, SIGTERM);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = process_gone(grandchild);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone);
  std::filesystem::remove(pid_file);
}

TEST(ChildProcess, CommandThatCannotStart) {
  ChildProcess c;
  ChildOptions o;
  o.argv = {"/nonexistent/troupe-no-such-binary"};
  auto st = c.start(o, "env x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, troupe::ErrorCode::invalid_input);
  EXPECT_NE(st.error().message.find("env x: cannot start '/nonexistent/troupe-no-such-binary'"), std::string::npos)
      << st.error().message;
  EXPECT_EQ(c.pid(), -1);
  EXPECT_FALSE(c.alive());
  EXPECT_EQ(c.log_tail(), "");
}

TEST(ChildProcess, StdioFdIsTheChildsStdinAndStdout) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ChildProcess c;
  ChildOptions o;
  o.argv = {"sh", "-c", "read x; echo \"got $x\""};
  o.stdio_fd = sv[1];
  ASSERT_TRUE(c.start(o, "test").ok());
  ::close(sv[1]);
  ASSERT_EQ(::write(sv[0], "hi\n", 3), 3);
  std::string out;
  char buf[64];
  for (ssize_t n; (n = ::read(sv[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(sv[0]);
  EXPECT_EQ(out, "got hi\n");
  c.stop(5.0, 0);
  EXPECT_EQ(describe_wait_status(c.exit_status()), "exited with status 0");
}
