// envs.nemo_gym: the nemo_gym env against real NeMo Gym resource servers from the nemo-gym PyPI
// package (installed on first use by ensure_nemo_gym.py): example_session_state_mgmt started by
// troupe from `command:` (its counter lives in the session, so it only adds up when the session
// cookie goes with every call), and example_multi_step with its bundled data at `url:`. Then the
// failure paths against a server the test runs itself (cpp-httplib): a slow answer is a timeout,
// a reply that is not JSON or has no reward is a protocol_error, a 5xx verify and a server that
// is gone are env_errors, a non-2xx tool answer is shown to the model and counted.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "troupe/base/build_config.h"
#include "troupe/envs/client.h"
#include "troupe/envs/nemo_gym.h"

extern char** environ;

using namespace troupe::envs;
namespace fs = std::filesystem;

namespace {

std::string run_text(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// The venv python with nemo-gym (installed on first use; the test fails, never skips, without it).
const std::string& nemo_python() {
  static const std::string py = [] {
    std::string out = run_text(troupe::python_executable() + " " + TROUPE_TEST_SOURCE_DIR "/tests/envs/ensure_nemo_gym.py");
    auto nl = out.rfind('\n');
    return nl == std::string::npos ? out : out.substr(nl + 1);
  }();
  return py;
}

std::string serve_script() { return std::string(TROUPE_TEST_SOURCE_DIR) + "/envs/python/nemo_gym_serve.py"; }

fs::path scratch() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("troupe-nemo-gym-test-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

void write_rows(const fs::path& path, const std::vector<json>& rows) {
  std::ofstream out(path);
  for (const auto& r : rows) out << r.dump() << "\n";
}

json counter_tools() {
  return json::array({{{"type", "function"}, {"name", "increment_counter"}, {"description", "Adds count to the counter."},
                       {"strict", true},
                       {"parameters", {{"type", "object"}, {"properties", {{"count", {{"type", "integer"}}}}}, {"required", {"count"}},
                                       {"additionalProperties", false}}}},
                      {{"type", "function"}, {"name", "get_counter_value"}, {"description", "The counter's value."},
                       {"strict", true},
                       {"parameters", {{"type", "object"}, {"properties", json::object()}, {"required", json::array()},
                                       {"additionalProperties", false}}}}});
}
json counter_row(int initial, int a, int b) {
  return {{"responses_create_params",
           {{"input", json::array({{{"role", "user"}, {"content", "add " + std::to_string(a) + " then add " + std::to_string(b) + " then get the count"}}})},
            {"tools", counter_tools()}}},
          {"initial_count", initial},
          {"expected_count", initial + a + b}};
}

std::string call(const std::string& name, json args) {
  return "<tool_call>" + json{{"name", name}, {"arguments", std::move(args)}}.dump() + "</tool_call>";
}

int free_port() {  // bound, read and closed: nothing listens there afterwards
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

troupe::Result<std::unique_ptr<EnvClient>> client(json spec) {
  spec["name"] = spec.value("name", std::string("ng"));
  spec["type"] = "nemo_gym";
  auto s = parse_env_spec(spec, "test");
  if (!s.ok()) return s.error();
  return make_env_client(*s);
}

}  // namespace

// troupe starts the server from `command:` ({port}), keeps each episode's session cookie, runs the
// tool calls as POST /<tool>, scores with /verify, aggregates eval episodes, and stops the server.
TEST(NemoGym, StatefulServerStartedFromCommand) {
  ASSERT_FALSE(nemo_python().empty());
  ASSERT_TRUE(fs::exists(nemo_python())) << "no nemo-gym python: '" << nemo_python() << "'";
  write_rows(scratch() / "counter.jsonl", {counter_row(3, 1, 2), counter_row(6, 4, 5), counter_row(10, 7, 8)});
  write_rows(scratch() / "counter_eval.jsonl", {counter_row(1, 1, 1)});
  auto c = client({{"command", {nemo_python(), serve_script(), "resources_servers.example_session_state_mgmt.app", "--port", "{port}"}},
                   {"config", {{"data", (scratch() / "counter.jsonl").string()}, {"eval_data", (scratch() / "counter_eval.jsonl").string()},
                               {"max_turns", 4}}},
                   {"timeout_s", 30},
                   {"startup_timeout_s", 240}});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EnvClient& env = **c;
  EXPECT_TRUE(env.info().multi_turn);
  ASSERT_EQ(env.info().tools.size(), 2u);
  EXPECT_EQ(env.info().tools[0].name, "increment_counter");
  const pid_t server = env.worker_pid();
  ASSERT_GT(server, 0);

  // seed 1 -> row 1: counter 6, add 4 and 5 -> 15
  auto obs = env.reset("a", 1, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  EXPECT_EQ(obs->metadata["task"], 1);
  EXPECT_NE(obs->text.find("add 4 then add 5"), std::string::npos) << obs->text;
  EXPECT_NE(obs->text.find("increment_counter"), std::string::npos);
  EXPECT_NE(obs->text.find("<tool_call>"), std::string::npos);
  auto s1 = env.step("a", "Adding. " + call("increment_counter", {{"count", 4}}) + call("increment_counter", {{"count", 5}}));
  ASSERT_TRUE(s1.ok()) << s1.error().message;
  EXPECT_FALSE(s1->done);
  EXPECT_NE(s1->observation.text.find("success"), std::string::npos) << s1->observation.text;
  ASSERT_EQ(s1->info["tool_calls"].size(), 2u);
  auto s2 = env.step("a", call("get_counter_value", json::object()));
  ASSERT_TRUE(s2.ok()) << s2.error().message;
  EXPECT_NE(s2->observation.text.find("15"), std::string::npos) << s2->observation.text;  // the session's counter
  auto s3 = env.step("a", "The count is 15.");
  ASSERT_TRUE(s3.ok()) << s3.error().message;
  EXPECT_TRUE(s3->done);
  EXPECT_EQ(s3->reward, 1.0);
  EXPECT_EQ(s3->info["tool_errors"], 0);
  env.release("a");

  // the same row in a new session starts at 6 again: answering without the tools scores 0
  ASSERT_TRUE(env.reset("b", 1, {}).ok());
  auto b = env.step("b", "15");
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_TRUE(b->done);
  EXPECT_EQ(b->reward, 0.0);
  env.release("b");

  // a tool the server does not have: its 404 is shown to the model and counted; the episode goes on
  ASSERT_TRUE(env.reset("c", 0, {}).ok());
  auto bad = env.step("c", call("reset_counter", json::object()));
  ASSERT_TRUE(bad.ok()) << bad.error().message;
  EXPECT_FALSE(bad->done);
  EXPECT_NE(bad->observation.text.find("HTTP 404"), std::string::npos) << bad->observation.text;
  EXPECT_FALSE(bad->info["tool_calls"][0]["ok"].get<bool>());
  auto fin = env.step("c", "done");
  ASSERT_TRUE(fin.ok());
  EXPECT_EQ(fin->info["tool_errors"], 1);
  env.release("c");

  // max_turns: the 4th turn ends the episode and is verified even though it calls a tool
  ASSERT_TRUE(env.reset("d", 2, {}).ok());
  for (int t = 0; t < 3; ++t) ASSERT_FALSE(env.step("d", call("get_counter_value", json::object()))->done);
  auto last = env.step("d", call("increment_counter", {{"count", 15}}));
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->done);
  EXPECT_EQ(last->info["termination"], "max_turns");
  EXPECT_EQ(last->reward, 1.0);  // 10 + 15 = 25 = 10 + 7 + 8
  env.release("d");

  // single-turn scoring: a session of its own, the completion's calls run in order, then /verify
  auto v = env.verify({{"task", 0}, {"split", "train"}}, call("increment_counter", {{"count", 3}}));
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(v->reward, 1.0);
  auto v0 = env.verify({{"task", 0}, {"split", "train"}}, "6");
  ASSERT_TRUE(v0.ok());
  EXPECT_EQ(v0->reward, 0.0);

  // eval split (the eval_data rows), then /aggregate_metrics over the eval episodes
  ResetOptions eval;
  eval.split = Split::eval;
  auto e = env.reset("e", 7, eval);
  ASSERT_TRUE(e.ok());
  EXPECT_NE(e->text.find("add 1 then add 1"), std::string::npos);
  auto ev = env.verify(e->metadata, call("increment_counter", {{"count", 2}}));
  ASSERT_TRUE(ev.ok()) << ev.error().message;
  EXPECT_EQ(ev->reward, 1.0);
  auto agg = env.aggregate_eval();
  ASSERT_TRUE(agg.ok()) << agg.error().message;
  EXPECT_EQ((*agg)["episodes"], 1) << agg->dump();
  bool has_reward_mean = false;
  for (auto it = agg->begin(); it != agg->end(); ++it)
    if (it.key().find("reward") != std::string::npos && it->is_number() && it->get<double>() == 1.0) has_reward_mean = true;
  EXPECT_TRUE(has_reward_mean) << agg->dump();
  auto again = env.aggregate_eval();  // nothing new since
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());

  // the server troupe started is stopped with the client
  c->reset();
  int status = 0;
  EXPECT_TRUE(::waitpid(server, &status, WNOHANG) == -1 || ::kill(server, 0) != 0);
}

// A resource server with bundled data (example_multi_step's example.jsonl) at `url:`.
TEST(NemoGym, BundledMultiStepAtUrl) {
  ASSERT_TRUE(fs::exists(nemo_python()));
  const std::string dir = run_text(nemo_python() +
                                   " -c 'import resources_servers.example_multi_step as m; print(list(m.__path__)[0])'");
  const std::string data = dir + "/data/example.jsonl";
  ASSERT_TRUE(fs::exists(data)) << data;
  std::vector<json> rows;
  {
    std::ifstream in(data);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) rows.push_back(json::parse(line));
  }
  ASSERT_GE(rows.size(), 2u);
  const int port = free_port();
  pid_t pid = spawn({nemo_python(), serve_script(), "resources_servers.example_multi_step.app", "--port", std::to_string(port)});
  ASSERT_GT(pid, 0);
  auto c = client({{"url", "http://127.0.0.1:" + std::to_string(port)},
                   {"config", {{"data", data}, {"eval_fraction", 0.0}, {"max_turns", 6}}},
                   {"timeout_s", 30},
                   {"startup_timeout_s", 240}});
  if (!c.ok()) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  ASSERT_TRUE(c.ok()) << c.error().message;
  EnvClient& env = **c;
  EXPECT_EQ(env.worker_pid(), -1);  // not troupe's to stop
  for (int seed = 0; seed < static_cast<int>(rows.size()); ++seed) {
    auto obs = env.reset("m", static_cast<uint64_t>(seed), {});
    ASSERT_TRUE(obs.ok()) << obs.error().message;
    const size_t task = obs->metadata["task"].get<size_t>();
    ASSERT_LT(task, rows.size());
    EXPECT_NE(obs->text.find("get_synonym_value"), std::string::npos);
    EXPECT_NE(obs->text.find("(system) "), std::string::npos);
    const json& expected = rows[task]["expected_synonym_values"];
    const std::string synonym = rows[task]["expected_synonyms"][0];
    // one tool round trip: the server's value of a synonym is the sum of its characters' codes
    auto s = env.step("m", call("get_synonym_value", {{"synonym", synonym}}));
    ASSERT_TRUE(s.ok()) << s.error().message;
    int sum = 0;
    for (unsigned char ch : synonym) sum += ch;
    EXPECT_NE(s->observation.text.find(std::to_string(sum)), std::string::npos) << s->observation.text;
    auto done = env.step("m", call("extract_synonym_values", {{"synonym_values", expected}}) + " Done.");
    ASSERT_TRUE(done.ok()) << done.error().message;
    EXPECT_FALSE(done->done);  // a tool call: the episode goes on
    auto fin = env.step("m", "Those are the values.");
    ASSERT_TRUE(fin.ok()) << fin.error().message;
    EXPECT_TRUE(fin->done);
    EXPECT_EQ(fin->reward, 1.0) << fin->info.dump();
    EXPECT_EQ(fin->info["fields"]["accuracy"], true);
    env.release("m");
    auto wrong = env.verify(obs->metadata, call("extract_synonym_values", {{"synonym_values", json::array({1, 2})}}));
    ASSERT_TRUE(wrong.ok()) << wrong.error().message;
    EXPECT_EQ(wrong->reward, 0.0);
  }
  c->reset();
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
}

namespace {

// A resource server written from the contract for fault injection: GET / answers; /seed_session
// sets a cookie; /verify answers per `verify_mode` (huge: 8 KiB; drip: a byte every 0.1 s for 3 s);
// /boom answers 500.
struct FakeServer {
  httplib::Server srv;
  std::thread thread;
  int port = 0;
  std::string verify_mode = "ok";  // ok | not_json | no_reward | http500 | slow | huge | drip
  std::atomic<int> cookie_hits{0};
  FakeServer() {
    srv.Get("/", [](const httplib::Request&, httplib::Response& r) { r.set_content("{\"status\": \"ok\"}", "application/json"); });
    srv.Post("/seed_session", [](const httplib::Request&, httplib::Response& r) {
      r.set_header("Set-Cookie", "sess=abc123; path=/; httponly");
      r.set_content("{}", "application/json");
    });
    srv.Post("/boom", [](const httplib::Request&, httplib::Response& r) {
      r.status = 500;
      r.set_content("tool broke", "text/plain");
    });
    srv.Post("/verify", [this](const httplib::Request& q, httplib::Response& r) {
      if (q.get_header_value("Cookie").find("sess=abc123") != std::string::npos) ++cookie_hits;
      if (verify_mode == "slow") std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      if (verify_mode == "http500") r.status = 500;
      if (verify_mode == "huge") {  // a good answer after 8 KiB of blanks
        r.set_content(std::string(8192, ' ') + "{\"reward\": 0.5}", "application/json");
        return;
      }
      if (verify_mode == "drip") {  // a blank every 0.1 s for 3 s, then a good answer
        r.set_chunked_content_provider("application/json", [](size_t, httplib::DataSink& sink) {
          for (int i = 0; i < 30; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            if (!sink.write(" ", 1)) return false;
          }
          sink.write("{\"reward\": 0.5}", 15);
          sink.done();
          return true;
        });
        return;
      }
      const char* body = verify_mode == "not_json" ? "<html>oops</html>" : verify_mode == "no_reward" ? "{\"score\": 1}" : "{\"reward\": 0.5, \"reward_components\": {\"format\": 1}}";
      r.set_content(body, "application/json");
    });
    port = srv.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { srv.listen_after_bind(); });
  }
  void stop() {
    srv.stop();
    if (thread.joinable()) thread.join();
  }
  ~FakeServer() { stop(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

json fake_rows() {
  write_rows(scratch() / "fake.jsonl", {{{"responses_create_params", {{"input", "say hi"}}}, {"answer", "hi"}}});
  return {{"data", (scratch() / "fake.jsonl").string()}, {"eval_fraction", 0.0}, {"max_turns", 2}};
}

}  // namespace

TEST(NemoGymFaults, EachFailureHasItsReason) {
  FakeServer fake;
  auto c = client({{"url", fake.url()}, {"config", fake_rows()}, {"timeout_s", 0.5}, {"startup_timeout_s", 5},
                   {"max_message_bytes", 4096}});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EnvClient& env = **c;
  const json meta = {{"task", 0}, {"split", "train"}};
  auto ok = env.verify(meta, "hi");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->reward, 0.5);
  EXPECT_EQ(ok->components.at("format"), 1.0);
  EXPECT_EQ(fake.cookie_hits.load(), 1);  // the seed_session cookie came back with /verify

  // a non-2xx tool answer is shown to the model and counted, not an episode failure
  ASSERT_TRUE(env.reset("t", 0, {}).ok());
  auto tool = env.step("t", call("boom", json::object()));
  ASSERT_TRUE(tool.ok()) << tool.error().message;
  EXPECT_NE(tool->observation.text.find("HTTP 500: tool broke"), std::string::npos) << tool->observation.text;
  auto end = env.step("t", "bye");
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->info["tool_errors"], 1);

  fake.verify_mode = "not_json";
  auto nj = env.verify(meta, "hi");
  ASSERT_FALSE(nj.ok());
  EXPECT_EQ(termination_for(nj.error()), Termination::protocol_error) << nj.error().message;
  fake.verify_mode = "no_reward";
  auto nr = env.verify(meta, "hi");
  ASSERT_FALSE(nr.ok());
  EXPECT_EQ(termination_for(nr.error()), Termination::protocol_error);
  EXPECT_NE(nr.error().message.find("no numeric 'reward'"), std::string::npos) << nr.error().message;
  fake.verify_mode = "http500";
  auto h5 = env.verify(meta, "hi");
  ASSERT_FALSE(h5.ok());
  EXPECT_EQ(termination_for(h5.error()), Termination::env_error);
  EXPECT_NE(h5.error().message.find("HTTP 500"), std::string::npos) << h5.error().message;
  fake.verify_mode = "slow";
  auto slow = env.verify(meta, "hi");
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(termination_for(slow.error()), Termination::timeout) << slow.error().message;
  // an answer over max_message_bytes is cut unread (protocol_error naming the bound); one dribbled
  // out past timeout_s is a timeout at timeout_s, although each of its reads came in time
  fake.verify_mode = "huge";
  auto huge = env.verify(meta, "hi");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(termination_for(huge.error()), Termination::protocol_error) << huge.error().message;
  EXPECT_NE(huge.error().message.find("larger than max_message_bytes 4096"), std::string::npos) << huge.error().message;
  fake.verify_mode = "drip";
  const auto t0 = std::chrono::steady_clock::now();
  auto drip = env.verify(meta, "hi");
  ASSERT_FALSE(drip.ok());
  EXPECT_EQ(termination_for(drip.error()), Termination::timeout) << drip.error().message;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  auto bad_meta = env.verify({{"split", "train"}}, "hi");
  ASSERT_FALSE(bad_meta.ok());
  EXPECT_EQ(termination_for(bad_meta.error()), Termination::protocol_error);

  // the server goes away: the next call is an env_error naming the URL
  fake.stop();
  auto gone = env.reset("g", 0, {});
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(termination_for(gone.error()), Termination::env_error);
  EXPECT_NE(gone.error().message.find(fake.url() + "/seed_session"), std::string::npos) << gone.error().message;
}

// A server of one's own (envs/python/examples/nemo_gym_keyword, outside the nemo-gym package):
// nemo_gym_serve.py takes its file (relative to cwd:), environment: puts its lib/ on PYTHONPATH
// (relative to that cwd), config.server_config sets its config class's own field, and its stdout
// and stderr are kept in log_dir (a run's logs/) after the server stopped.
TEST(NemoGym, OwnServerWithCwdEnvironmentServerConfigAndLogs) {
  ASSERT_TRUE(fs::exists(nemo_python())) << "no nemo-gym python: '" << nemo_python() << "'";
  const std::string dir = std::string(TROUPE_TEST_SOURCE_DIR) + "/envs/python/examples/nemo_gym_keyword";
  const fs::path logs = scratch() / "own_logs";
  fs::remove_all(logs);
  auto own = [&](json server_config) {
    return client({{"command", {nemo_python(), serve_script(), "app.py", "--port", "{port}"}},
                   {"cwd", dir},
                   {"environment", {{"PYTHONPATH", "lib"}, {"TROUPE_TEST_MARK", 7}}},
                   {"log_dir", logs.string()},
                   {"config", {{"data", dir + "/rows.jsonl"}, {"max_turns", 1}, {"server_config", server_config}}},
                   {"timeout_s", 30},
                   {"startup_timeout_s", 240}});
  };
  {
    auto c = own({{"keyword_reward", 0.5}});
    ASSERT_TRUE(c.ok()) << c.error().message;
    auto obs = (*c)->reset("a", 0, {});
    ASSERT_TRUE(obs.ok()) << obs.error().message;
    EXPECT_NE(obs->text.find("red"), std::string::npos) << obs->text;
    auto hit = (*c)->step("a", "An apple.");
    ASSERT_TRUE(hit.ok()) << hit.error().message;
    EXPECT_EQ(hit->reward, 0.5);  // the server's keyword_reward, from server_config
    (*c)->release("a");
    ASSERT_TRUE((*c)->reset("b", 1, {}).ok());
    auto miss = (*c)->step("b", "A cherry.");
    ASSERT_TRUE(miss.ok()) << miss.error().message;
    EXPECT_EQ(miss->reward, 0.0);
    (*c)->release("b");
  }
  std::string log_text;
  for (const auto& f : fs::directory_iterator(logs)) {
    EXPECT_EQ(f.path().filename().string().rfind("env-ng-", 0), 0u) << f.path();
    std::ifstream in(f.path());
    log_text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  EXPECT_NE(log_text.find("KeywordResourcesServer on http://127.0.0.1:"), std::string::npos) << log_text;  // stderr
  EXPECT_NE(log_text.find("verify: keyword 'apple' found=True reward=0.5"), std::string::npos) << log_text;  // stdout
  // a field the server's config class does not have stops the start, quoting the kept log
  auto bad = own({{"keyword_rewrd", 1}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("has no field keyword_rewrd"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find(logs.string()), std::string::npos) << bad.error().message;
}

TEST(NemoGymFaults, StartupAndConfigErrors) {
  // nothing listens there: startup fails within startup_timeout_s, naming the URL
  const int port = free_port();
  auto down = client({{"url", "http://127.0.0.1:" + std::to_string(port)}, {"config", fake_rows()}, {"startup_timeout_s", 0.3}});
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.error().code, troupe::ErrorCode::timeout);
  EXPECT_NE(down.error().message.find("did not answer GET /"), std::string::npos) << down.error().message;
  // a command that exits at once: the error says so and quotes its stderr
  auto dies = client({{"command", {"sh", "-c", "echo no server here >&2; exit 2", "{port}"}}, {"config", fake_rows()}});
  ASSERT_FALSE(dies.ok());
  EXPECT_EQ(dies.error().code, troupe::ErrorCode::invalid_input);
  EXPECT_NE(dies.error().message.find("no server here"), std::string::npos) << dies.error().message;
  // spec and config errors
  auto both = parse_env_spec({{"name", "x"}, {"type", "nemo_gym"}, {"url", "http://a:1"}, {"command", {"a"}}}, "cfg.yaml: envs[0]");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.error().message.find("exactly one of 'url'"), std::string::npos);
  EXPECT_FALSE(parse_env_spec({{"name", "x"}, {"type", "builtin"}, {"env", "arithmetic"}, {"url", "http://a:1"}}, "t").ok());
  auto https = client({{"url", "https://127.0.0.1:1"}, {"config", fake_rows()}});
  ASSERT_FALSE(https.ok());
  EXPECT_NE(https.error().message.find("must be http://HOST:PORT"), std::string::npos);
  auto nodata = client({{"url", "http://127.0.0.1:1"}, {"config", json::object()}});
  ASSERT_FALSE(nodata.ok());
  EXPECT_NE(nodata.error().message.find("'data'"), std::string::npos) << nodata.error().message;
  std::ofstream(scratch() / "bad.jsonl") << "{\"responses_create_params\": {\"input\": \"ok\"}}\n{\"no\": 1}\n";
  auto badrow = client({{"url", "http://127.0.0.1:1"}, {"config", {{"data", (scratch() / "bad.jsonl").string()}}}});
  ASSERT_FALSE(badrow.ok());
  EXPECT_NE(badrow.error().message.find("bad.jsonl:2"), std::string::npos) << badrow.error().message;
  // cwd that is not a directory; environment or cwd without a command; server_config for a server at url:
  auto nocwd = client({{"command", {"sh", "-c", "sleep 9", "{port}"}}, {"cwd", "/no/such/dir"}, {"config", fake_rows()}});
  ASSERT_FALSE(nocwd.ok());
  EXPECT_NE(nocwd.error().message.find("its cwd '/no/such/dir' is not a directory"), std::string::npos) << nocwd.error().message;
  auto envurl = parse_env_spec({{"name", "x"}, {"type", "nemo_gym"}, {"url", "http://a:1"}, {"cwd", "/tmp"}}, "cfg.yaml: envs[0]");
  ASSERT_FALSE(envurl.ok());
  EXPECT_NE(envurl.error().message.find("'environment' and 'cwd' are for a 'command' troupe starts"), std::string::npos);
  auto badenv = parse_env_spec({{"name", "x"}, {"type", "remote"}, {"command", {"a"}}, {"environment", {{"A", {1, 2}}}}}, "t");
  ASSERT_FALSE(badenv.ok());
  EXPECT_NE(badenv.error().message.find("environment.A must be a string, number or bool"), std::string::npos);
  auto scurl = client({{"url", "http://127.0.0.1:1"}, {"config", {{"data", "x.jsonl"}, {"server_config", {{"a", 1}}}}}});
  ASSERT_FALSE(scurl.ok());
  EXPECT_NE(scurl.error().message.find("server_config is for a server troupe starts"), std::string::npos) << scurl.error().message;
  auto typo = client({{"url", "http://127.0.0.1:1"}, {"config", {{"data", "x.jsonl"}, {"max_turn", 3}}}});
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.error().message.find("unknown config key 'max_turn'"), std::string::npos);
}

TEST(NemoGymTask, OutputAndSplits) {
  nemo_gym::Output out;
  std::vector<std::string> ids;
  std::string turn = "Let me look. ";
  turn.append(call("f", {{"x", 1}})).append("<tool_call>not json</tool_call>");
  auto calls = out.add_turn(turn, ids);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_TRUE(calls[0].ok);
  EXPECT_FALSE(calls[1].ok);
  out.add_tool_output(ids[0], "{\"y\": 2}");
  const json& items = out.items();
  ASSERT_EQ(items.size(), 3u);  // message, function_call (the malformed call is not sent), output
  EXPECT_EQ(items[0]["type"], "message");
  EXPECT_EQ(items[0]["content"][0]["text"], "Let me look.");
  EXPECT_EQ(items[1]["type"], "function_call");
  EXPECT_EQ(items[1]["arguments"], "{\"x\":1}");
  EXPECT_EQ(items[2]["call_id"], items[1]["call_id"]);
  json row = {{"responses_create_params", {{"input", "q"}}}, {"expected", 3}};
  json r = out.response(row);
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(nemo_gym::verify_body(row, r)["expected"], 3);
  // splits: eval_data rows are held out of train; without it a hash of the row decides
  std::vector<json> rows;
  for (int i = 0; i < 50; ++i) {
    json input = std::to_string(i);
    rows.push_back({{"responses_create_params", {{"input", input}}}});
  }
  write_rows(scratch() / "split.jsonl", rows);
  write_rows(scratch() / "split_eval.jsonl", {rows[3], rows[7]});
  nemo_gym::Settings s;
  s.data = (scratch() / "split.jsonl").string();
  s.eval_data = (scratch() / "split_eval.jsonl").string();
  auto sp = nemo_gym::load_splits(s, "t");
  ASSERT_TRUE(sp.ok()) << sp.error().message;
  EXPECT_EQ(sp->train.size(), 48u);
  EXPECT_EQ(sp->eval.size(), 2u);
  s.eval_data.clear();
  s.eval_fraction = 0.3;
  sp = nemo_gym::load_splits(s, "t");
  ASSERT_TRUE(sp.ok());
  EXPECT_EQ(sp->train.size() + sp->eval.size(), 50u);
  EXPECT_GT(sp->eval.size(), 5u);
  for (const auto& e : sp->eval)
    for (const auto& t : sp->train) EXPECT_NE(e.canonical, t.canonical);
}
