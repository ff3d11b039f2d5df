// envs.max_message: envs[].max_message_bytes bounds every env protocol socket. A remote server whose
// reply is over the limit, or a request over an isolated worker's limit, never reaches the reader:
// libzmq drops the connection unread, the call fails as a timeout naming the limit and the peer whose
// connection was dropped (a socket monitor's events: connection_watch.h), and the next
// call (on a new connection, or a restarted worker) works. A Python SDK server troupe starts gets
// the limit too ($TROUPE_ENV_MAX_MESSAGE_BYTES).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include <zmq.hpp>

#include "troupe/base/build_config.h"
#include "troupe/envs/client.h"
#include "troupe/envs/remote.h"

using namespace troupe::envs;

namespace {

constexpr int kLimit = 64 * 1024;

// A raw REP peer speaking just enough of the protocol: reset with seed 1 answers a 1 MiB text.
class BigReplyServer {
 public:
  BigReplyServer() : sock_(ctx_, zmq::socket_type::rep) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.bind("tcp://127.0.0.1:*");
    address_ = sock_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { loop(); });
  }
  ~BigReplyServer() {
    stop_ = true;
    thread_.join();
  }
  const std::string& address() const { return address_; }

 private:
  void loop() {
    while (!stop_) {
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t m;
      if (!sock_.recv(m, zmq::recv_flags::none)) continue;
      json req = json::parse(m.to_string_view());
      json result;
      if (req["op"] == "hello") {
        result = {{"protocol", kEnvProtocol}, {"env", {{"name", "big"}, {"version", "1"}}}};
      } else if (req["op"] == "reset") {
        const bool big = req.value("seed", 0) == 1;
        result = {{"text", std::string(big ? 1 << 20 : 8, 'x')}, {"metadata", json::object()}};
      } else {
        result = json::object();
      }
      const std::string text = json{{"ok", true}, {"id", req["id"]}, {"result", result}}.dump();
      sock_.send(zmq::buffer(text), zmq::send_flags::none);
    }
  }
  zmq::context_t ctx_;
  zmq::socket_t sock_;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

TEST(MaxMessage, OversizedRemoteReplyFailsTheCallNotTheClient) {
  BigReplyServer server;
  auto spec = parse_env_spec({{"name", "big"}, {"type", "remote"}, {"address", server.address()},
                              {"timeout_s", 1.0}, {"max_message_bytes", kLimit}},
                             "test");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  auto c = make_env_client(*spec);
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto small = (*c)->reset("a", 0, {});
  ASSERT_TRUE(small.ok()) << small.error().message;
  auto big = (*c)->reset("b", 1, {});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, troupe::ErrorCode::timeout);
  EXPECT_NE(big.error().message.find("max_message_bytes 65536"), std::string::npos) << big.error().message;
  // the error names the peer whose connection was dropped (the server's address, as getpeername read it)
  std::printf("the error: %s\n", big.error().message.c_str());
  const std::string peer = server.address().substr(std::string("tcp://").size());
  EXPECT_NE(big.error().message.find("env big (" + server.address() + ")"), std::string::npos) << big.error().message;
  EXPECT_NE(big.error().message.find("the connection to " + peer + " (from 127.0.0.1:"), std::string::npos)
      << big.error().message;
  EXPECT_NE(big.error().message.find("was dropped"), std::string::npos) << big.error().message;
  auto again = (*c)->reset("c", 2, {});  // a new connection: the run goes on
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->text, "xxxxxxxx");
}

TEST(MaxMessage, OversizedRequestRestartsTheIsolatedWorker) {
  auto spec = parse_env_spec({{"name", "arithmetic"}, {"isolate", true}, {"timeout_s", 1.0},
                              {"startup_timeout_s", 20}, {"max_message_bytes", kLimit}},
                             "test");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  auto c = make_env_client(*spec);
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto obs = (*c)->reset("a", 3, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  auto big = (*c)->verify(obs->metadata, std::string(2 * kLimit, '7'));  // the worker drops it unread
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, troupe::ErrorCode::timeout);
  EXPECT_NE(big.error().message.find("max_message_bytes"), std::string::npos) << big.error().message;
  // the worker is named, and the connection to its socket it dropped
  std::printf("the error: %s\n", big.error().message.c_str());
  EXPECT_NE(big.error().message.find("env arithmetic (worker pid "), std::string::npos) << big.error().message;
  EXPECT_NE(big.error().message.find("the connection to ipc://"), std::string::npos) << big.error().message;
  EXPECT_NE(big.error().message.find("request over the server's limit"), std::string::npos) << big.error().message;
  EXPECT_EQ((*c)->restarts(), 1);
  auto fine = (*c)->verify(obs->metadata, "nope");
  ASSERT_TRUE(fine.ok()) << fine.error().message;
  EXPECT_EQ(fine->reward, 0.0);
}

TEST(MaxMessage, PythonSdkServerDropsAnOversizedRequest) {
  auto spec = parse_env_spec(
      {{"name", "py"}, {"type", "remote"},
       {"command", {troupe::python_executable(), std::string(TROUPE_TEST_ENVS_DIR) + "/python/examples/arithmetic_env.py"}},
       {"environment", {{"PYTHONPATH", std::string(TROUPE_TEST_ENVS_DIR) + "/python"}}},  // this checkout's SDK
       {"timeout_s", 2.0}, {"startup_timeout_s", 60}, {"max_message_bytes", kLimit}},
      "test");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  auto c = make_env_client(*spec);
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto obs = (*c)->reset("a", 3, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  auto big = (*c)->verify(obs->metadata, std::string(2 * kLimit, '7'));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, troupe::ErrorCode::timeout) << big.error().message;
  EXPECT_EQ((*c)->restarts(), 1);
  auto fine = (*c)->verify(obs->metadata, obs->metadata["answer"].get<std::string>());
  ASSERT_TRUE(fine.ok()) << fine.error().message;
  EXPECT_EQ(fine->reward, 1.0);
}

TEST(MaxMessage, SpecRejectsATinyLimit) {
  auto spec = parse_env_spec({{"name", "arithmetic"}, {"max_message_bytes", 10}}, "cfg.yaml: envs[0]");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().message.find("cfg.yaml: envs[0]: 'max_message_bytes' must be >= 1024"), std::string::npos)
      << spec.error().message;
}
