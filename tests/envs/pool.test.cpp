// envs.pool: an env served by a pool of running servers (`addresses:`), here standalone env servers
// (troupe-env-worker serving guess_number) on 127.0.0.1: episodes spread by load, a killed or hung member taken out
// (its episode fails, new ones go to the others) and taken back once it answers again, members
// added and removed, and the spec errors.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "troupe/envs/client.h"
#include "troupe/envs/env_pool.h"

extern char** environ;

using namespace troupe::envs;

namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// One standalone env server (troupe-env-worker, as `troupe env serve` runs it) serving guess_number
// on a port of its own, killed at the end.
struct Server {
  std::string address, env;
  pid_t pid = -1;
  explicit Server(int port, std::string served = "guess_number")
      : address("tcp://127.0.0.1:" + std::to_string(port)), env(std::move(served)) {
    start();
  }
  void start() {
    std::vector<std::string> args = {TROUPE_TEST_ENV_WORKER, "--bind", address, "--env", env};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  }
  void kill9() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~Server() {
    if (pid <= 0) return;
    ::kill(pid, SIGCONT);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

EnvSpec pool_spec(const std::vector<std::string>& addresses, double timeout_s = 1.0) {
  json j = {{"name", "guess"}, {"type", "remote"}, {"addresses", addresses}, {"timeout_s", timeout_s},
            {"startup_timeout_s", 20}};
  auto s = parse_env_spec(j, "test");
  EXPECT_TRUE(s.ok()) << s.error().message;
  return s.ok() ? *s : EnvSpec{};
}

const PoolMember& member(const std::vector<PoolMember>& ms, const std::string& address) {
  for (const auto& m : ms)
    if (m.address == address) return m;
  throw std::runtime_error("no member " + address);
}

// Waits up to `seconds` for `pred`.
template <class F>
bool eventually(F pred, double seconds) {
  for (int i = 0; i < static_cast<int>(seconds * 20); ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

}  // namespace

TEST(EnvPool, SpreadsEpisodesByLoad) {
  Server a(free_port()), b(free_port()), c(free_port());
  auto pool = EnvPool::open(pool_spec({a.address, b.address, c.address}));
  ASSERT_TRUE(pool.ok()) << pool.error().message;
  EXPECT_EQ((*pool)->info().name, "guess_number");
  for (int i = 0; i < 6; ++i) ASSERT_TRUE((*pool)->reset(std::string("e").append(std::to_string(i)), static_cast<uint64_t>(i), {}).ok());
  for (const auto& m : (*pool)->members()) {
    EXPECT_TRUE(m.up);
    EXPECT_EQ(m.in_flight, 2) << m.address;
    EXPECT_EQ(m.episodes, 2) << m.address;
  }
  // the least loaded member takes the next one: free two episodes of whichever member e0 is on
  (*pool)->release("e0");
  (*pool)->release("e3");
  ASSERT_TRUE((*pool)->reset("e6", 6, {}).ok());
  ASSERT_TRUE((*pool)->step("e6", "50").ok());
  int loads = 0;
  for (const auto& m : (*pool)->members()) loads += m.in_flight;
  EXPECT_EQ(loads, 5);
  for (const auto& m : (*pool)->members()) EXPECT_LE(m.in_flight, 2) << m.address;
}

TEST(EnvPool, DeadMemberLeavesAndComesBack) {
  const int port_b = free_port();
  Server a(free_port()), b(port_b);
  auto pool = EnvPool::open(pool_spec({a.address, b.address}));
  ASSERT_TRUE(pool.ok()) << pool.error().message;
  ASSERT_TRUE((*pool)->reset("x", 1, {}).ok());  // on a
  ASSERT_TRUE((*pool)->reset("y", 2, {}).ok());  // on b
  EXPECT_EQ(member((*pool)->members(), b.address).in_flight, 1);
  b.kill9();
  auto lost = (*pool)->step("y", "50");  // no answer within timeout_s: b is out of the pool
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(termination_for(lost.error()), Termination::timeout) << lost.error().message;
  auto ms = (*pool)->members();
  EXPECT_FALSE(member(ms, b.address).up);
  EXPECT_EQ(member(ms, b.address).failures, 1);
  EXPECT_NE(member(ms, b.address).last_error.find("no answer to step"), std::string::npos);
  // its episode fails at once now; new episodes all go to a
  auto again = (*pool)->step("y", "50");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, troupe::ErrorCode::peer_failed);
  EXPECT_NE(again.error().message.find("left the pool"), std::string::npos) << again.error().message;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*pool)->reset(std::string("n").append(std::to_string(i)), 10u + i, {}).ok());
  EXPECT_EQ(member((*pool)->members(), a.address).episodes, 5);
  EXPECT_TRUE((*pool)->step("x", "50").ok());
  // the server comes back on its address: probed back in, and used again
  b.start();
  ASSERT_TRUE(eventually([&] { return member((*pool)->members(), b.address).up; }, 15)) << "b never came back";
  ASSERT_TRUE((*pool)->reset("z", 3, {}).ok());
  EXPECT_EQ(member((*pool)->members(), b.address).episodes, 2);
  EXPECT_TRUE((*pool)->step("z", "50").ok());
}

TEST(EnvPool, HungMemberTimesOutThenReturns) {
  Server a(free_port()), b(free_port());
  auto pool = EnvPool::open(pool_spec({a.address, b.address}, 0.5));
  ASSERT_TRUE(pool.ok()) << pool.error().message;
  ASSERT_TRUE((*pool)->reset("x", 1, {}).ok());
  ASSERT_TRUE((*pool)->reset("y", 2, {}).ok());
  ::kill(b.pid, SIGSTOP);
  auto hung = (*pool)->step("y", "50");
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(termination_for(hung.error()), Termination::timeout);
  EXPECT_FALSE(member((*pool)->members(), b.address).up);
  // verify and reset go to a meanwhile (a probe of the stopped server gets no hello)
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_FALSE(member((*pool)->members(), b.address).up);
  ASSERT_TRUE((*pool)->reset("w", 4, {}).ok());
  EXPECT_EQ(member((*pool)->members(), a.address).episodes, 2);
  ::kill(b.pid, SIGCONT);
  ASSERT_TRUE(eventually([&] { return member((*pool)->members(), b.address).up; }, 15)) << "b never came back";
}

TEST(EnvPool, AddAndRemoveMembers) {
  Server a(free_port()), b(free_port()), c(free_port());
  auto pool = EnvPool::open(pool_spec({a.address}));
  ASSERT_TRUE(pool.ok()) << pool.error().message;
  ASSERT_TRUE((*pool)->add_member(b.address).ok());
  auto twice = (*pool)->add_member(b.address);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("already in the pool"), std::string::npos);
  auto bad = (*pool)->add_member("tcp://127.0.0.1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("tcp://HOST:PORT"), std::string::npos) << bad.error().message;
  ASSERT_TRUE((*pool)->reset("p", 1, {}).ok());  // a
  ASSERT_TRUE((*pool)->reset("q", 2, {}).ok());  // b, the newcomer
  EXPECT_EQ(member((*pool)->members(), b.address).episodes, 1);
  ASSERT_TRUE((*pool)->remove_member(b.address).ok());
  EXPECT_EQ((*pool)->members().size(), 1u);
  auto gone = (*pool)->step("q", "50");
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, troupe::ErrorCode::peer_failed);
  EXPECT_NE(gone.error().message.find("removed"), std::string::npos) << gone.error().message;
  (*pool)->release("q");
  EXPECT_FALSE((*pool)->remove_member(b.address).ok());
  // a server that serves another env is refused by name
  Server other(free_port(), "arithmetic");
  auto wrong = (*pool)->add_member(other.address);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("serves env 'arithmetic', the pool serves 'guess_number'"), std::string::npos)
      << wrong.error().message;
}

TEST(EnvPool, SharedByTheClientsOfOneProcess) {
  Server a(free_port()), b(free_port());
  auto spec = pool_spec({a.address, b.address});
  auto c1 = make_env_client(spec);
  auto c2 = make_env_client(spec);
  ASSERT_TRUE(c1.ok() && c2.ok());
  EXPECT_TRUE((*c1)->concurrent());
  ASSERT_TRUE((*c1)->reset("u", 1, {}).ok());
  ASSERT_TRUE((*c2)->reset("v", 2, {}).ok());
  auto pools = find_env_pools("guess");
  ASSERT_EQ(pools.size(), 1u);
  for (const auto& m : pools[0]->members()) EXPECT_EQ(m.in_flight, 1) << m.address;  // one view of the load
}

TEST(EnvPool, NoServerAnswers) {
  auto spec = pool_spec({"tcp://127.0.0.1:" + std::to_string(free_port())});
  spec.startup_timeout_s = 0.5;
  auto pool = EnvPool::open(spec);
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.error().message.find("no server of the pool answered"), std::string::npos) << pool.error().message;
}

TEST(EnvPool, SpecErrors) {
  auto err = [](json j) {
    auto s = parse_env_spec(j, "x.yaml: envs[0]");
    return s.ok() ? std::string("(parsed)") : s.error().message;
  };
  EXPECT_NE(err({{"name", "p"}, {"addresses", json::array()}}).find("'addresses' is empty"), std::string::npos);
  EXPECT_NE(err({{"name", "p"}, {"address", "tcp://127.0.0.1:5"}, {"addresses", {"tcp://127.0.0.1:6"}}})
                .find("goes without 'address'"),
            std::string::npos);
  EXPECT_NE(err({{"name", "p"}, {"addresses", {"127.0.0.1:6"}}}).find("is not an env server's address (tcp://HOST:PORT"),
            std::string::npos);
  EXPECT_NE(err({{"name", "p"}, {"addresses", {"tcp://127.0.0.1:70000"}}}).find("tcp://HOST:PORT"), std::string::npos);
  EXPECT_NE(err({{"name", "p"}, {"addresses", {"tcp://a:1", "tcp://a:1"}}}).find("twice"), std::string::npos);
  EXPECT_NE(err({{"name", "p"}, {"type", "nemo_gym"}, {"addresses", {"tcp://a:1"}}}).find("http://HOST:PORT"),
            std::string::npos);
  EXPECT_NE(err({{"name", "arithmetic"}, {"type", "builtin"}, {"addresses", {"tcp://a:1"}}}).find("only for type remote"),
            std::string::npos);
  EXPECT_NE(err({{"name", "p"}, {"addresses", "tcp://a:1"}}).find("must be a list"), std::string::npos);
  // without type: tcp:// addresses make a remote env, http:// ones a nemo_gym env
  auto r = parse_env_spec({{"name", "p"}, {"addresses", {"tcp://a:1", "ipc:///tmp/x.sock"}}}, "t");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->type, EnvType::remote);
  auto n = parse_env_spec({{"name", "p"}, {"addresses", {"http://a:1"}}, {"config", {{"data", "rows.jsonl"}}}}, "t");
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(n->type, EnvType::nemo_gym);
  EXPECT_EQ(to_json(*r)["addresses"].size(), 2u);
}
