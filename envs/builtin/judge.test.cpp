// envs.judge: the dataset env's LLM judge — rubric rendering, reply parsing and range mapping, every
// bad config key named, and the HTTP call against a scripted OpenAI-compatible server on 127.0.0.1
// (a score, garbage, HTTP 500, a hang past timeout_s, a wrong API key), alone and inside the env.
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "builtin/judge.h"
#include "troupe/envs/builtin.h"
#include "troupe/envs/client.h"

using namespace troupe::envs;
using troupe::envs::detail::JudgeConfig;
using json = nlohmann::json;

namespace {

template <class T>
std::string reason(const troupe::Result<T>& r) { return r.ok() ? "ok" : termination_name(termination_for(r.error())); }

// Answers POST /v1/chat/completions by what the user message holds: HANG sleeps 3 s, FAIL500 is a
// 500, GARBAGE has no score, JSON answers {"score": 7}, BIG scores 11, HUGE is 17 MiB long, DRIP
// sends its answer a byte every 0.1 s for 3 s, else "Score: 8". A request
// without "Authorization: Bearer sekret" gets 401. It records the last request body.
class FakeJudgeServer {
 public:
  FakeJudgeServer() {
    server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      {
        std::lock_guard lock(mu_);
        last_body_ = req.body;
      }
      if (req.get_header_value("Authorization") != "Bearer sekret") {
        res.status = 401;
        res.set_content(R"({"error": "bad key"})", "application/json");
        return;
      }
      const json body = json::parse(req.body);
      const std::string msg = body["messages"][0]["content"];
      std::string content = "The response is good.\nScore: 8";
      if (msg.find("HANG") != std::string::npos) std::this_thread::sleep_for(std::chrono::seconds(3));
      if (msg.find("FAIL500") != std::string::npos) {
        res.status = 500;
        res.set_content("internal error", "text/plain");
        return;
      }
      if (msg.find("GARBAGE") != std::string::npos) content = "I cannot decide.";
      if (msg.find("JSON") != std::string::npos) content = "```json\n{\"score\": 7}\n```";
      if (msg.find("BIG") != std::string::npos) content = "Score: 11";
      json reply = {{"choices", json::array({{{"index", 0}, {"message", {{"role", "assistant"}, {"content", content}}}}})}};
      if (msg.find("HUGE") != std::string::npos) {  // a good answer after 17 MiB of blanks
        res.set_content(std::string(size_t{17} << 20, ' ') + reply.dump(), "application/json");
        return;
      }
      if (msg.find("DRIP") != std::string::npos) {  // a blank every 0.1 s for 3 s, then a good answer
        res.set_chunked_content_provider("application/json", [text = reply.dump()](size_t, httplib::DataSink& sink) {
          for (int i = 0; i < 30; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            if (!sink.write(" ", 1)) return false;
          }
          sink.write(text.data(), text.size());
          sink.done();
          return true;
        });
        return;
      }
      res.set_content(reply.dump(), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~FakeJudgeServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  std::string last_body() const {
    std::lock_guard lock(mu_);
    return last_body_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;  // last_body_ is written on the server's threads
  std::string last_body_;
};

class Judge : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("TROUPE_TEST_JUDGE_KEY", "sekret", 1);
    dir_ = std::filesystem::temp_directory_path() / ("troupe-judge-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "rows.jsonl") << R"({"question": "1+1", "answer": "2"})" "\n"
                                       << R"({"question": "2+2", "answer": "4"})" "\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  json judge_config(double timeout_s = 5) const {
    return {{"url", server_.url()}, {"model", "judge-model"}, {"api_key_env", "TROUPE_TEST_JUDGE_KEY"},
            {"rubric", "Q: {prompt}\nA: {response}\nRef: {reference}"}, {"range", {0, 10}}, {"timeout_s", timeout_s}};
  }
  json env_config(json judge, const std::string& verifier = "exact") const {
    return {{"train", (dir_ / "rows.jsonl").string()}, {"eval_fraction", 0.0}, {"verifier", verifier}, {"judge", judge}};
  }
  std::string config_error(const json& config) const {
    auto e = make_dataset_env(config);
    return e.ok() ? "(no error)" : e.error().message;
  }

  FakeJudgeServer server_;
  std::filesystem::path dir_;
};

}  // namespace

TEST(JudgeRubric, RendersPlaceholdersAndNamesUnknownOnes) {
  auto r = detail::render_rubric("P={prompt} R={response} A={reference} {{x}} {\"score\": N}", "p", "r", "a");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "P=p R=r A=a {x} {\"score\": N}");
  auto bad = detail::render_rubric("{prompt} {answer}", "p", "r", "a");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("{answer}"), std::string::npos) << bad.error().message;
}

TEST(JudgeParse, RegexJsonAndRange) {
  JudgeConfig c;
  c.pattern = R"(Score:\s*(-?[0-9.]+))";
  c.lo = 0;
  c.hi = 10;
  EXPECT_DOUBLE_EQ(*detail::parse_judge_reply(c, "Score: 3\nthen Score: 7"), 0.7);  // the last match
  EXPECT_DOUBLE_EQ(*detail::parse_judge_reply(c, "Score: 10"), 1.0);
  EXPECT_DOUBLE_EQ(*detail::parse_judge_reply(c, "Score: 0"), 0.0);
  auto out = detail::parse_judge_reply(c, "Score: 11");
  EXPECT_EQ(reason(out), "judge_parse");
  EXPECT_NE(out.error().message.find("score 11 is outside range [0, 10]"), std::string::npos) << out.error().message;
  EXPECT_EQ(reason(detail::parse_judge_reply(c, "Score: -1")), "judge_parse");
  EXPECT_EQ(reason(detail::parse_judge_reply(c, "no score")), "judge_parse");
  EXPECT_EQ(reason(detail::parse_judge_reply(c, "Score: 1.2.3")), "judge_parse");
  c.lo = 1;
  c.hi = 5;
  EXPECT_DOUBLE_EQ(*detail::parse_judge_reply(c, "Score: 4"), 0.75);
  c.parse = detail::JudgeParse::json;
  c.field = "score";
  EXPECT_DOUBLE_EQ(*detail::parse_judge_reply(c, R"({"score": 3, "why": "ok"})"), 0.5);
  EXPECT_DOUBLE_EQ(*detail::parse_judge_reply(c, "```json\n{\"score\": \"5\"}\n```"), 1.0);
  EXPECT_EQ(reason(detail::parse_judge_reply(c, R"({"grade": 3})")), "judge_parse");
  EXPECT_EQ(reason(detail::parse_judge_reply(c, R"({"score": "high"})")), "judge_parse");
  EXPECT_EQ(reason(detail::parse_judge_reply(c, "not json")), "judge_parse");
  EXPECT_EQ(reason(detail::parse_judge_reply(c, R"({"score": 9})")), "judge_parse");
}

TEST_F(Judge, BadConfigsNameTheKey) {
  auto err = [&](const std::string& key, const json& value) {
    json j = judge_config();
    if (value.is_null()) j.erase(key);
    else j[key] = value;
    return config_error(env_config(j));
  };
  EXPECT_NE(err("url", nullptr).find("'url' is required"), std::string::npos) << err("url", nullptr);
  EXPECT_NE(err("url", "/models/judge").find("'url' must be an http"), std::string::npos);
  EXPECT_NE(err("model", nullptr).find("'model' is required"), std::string::npos);
  EXPECT_NE(err("rubric", "{prompt} {answer}").find("'rubric': unknown placeholder {answer}"), std::string::npos);
  EXPECT_NE(err("parse", "xml").find("'parse' must be regex or json"), std::string::npos);
  EXPECT_NE(err("pattern", "Score: [0-9]+").find("'pattern' needs a capture group"), std::string::npos);
  EXPECT_NE(err("pattern", "Score: ([0-9]+").find("'pattern' is not a valid regex"), std::string::npos);
  EXPECT_NE(err("field", "score").find("'field' is for parse: json"), std::string::npos);
  EXPECT_NE(err("parse", "json").find("needs 'field'"), std::string::npos);
  EXPECT_NE(err("range", json::array({10, 0})).find("'range' needs lo < hi"), std::string::npos);
  EXPECT_NE(err("range", 5).find("'range' must be [lo, hi]"), std::string::npos);
  EXPECT_NE(err("timeout_s", 0).find("'timeout_s' must be"), std::string::npos);
  EXPECT_NE(err("max_tokens", "many").find("'max_tokens' must be"), std::string::npos);
  EXPECT_NE(err("temperature", 5).find("'temperature' must be"), std::string::npos);
  EXPECT_NE(err("api_key_env", "TROUPE_TEST_NO_SUCH_VAR").find("$TROUPE_TEST_NO_SUCH_VAR, which is not set"),
            std::string::npos);
  EXPECT_NE(err("colour", "red").find("unknown config key 'colour'"), std::string::npos);
  EXPECT_NE(config_error(env_config("http://x")).find("judge must be a mapping"), std::string::npos);
  // reward_weights: each names a component of this env; only with a judge
  json c = env_config(judge_config());
  c["reward_weights"] = {{"verifier", 1}, {"jugde", 2}};
  EXPECT_NE(config_error(c).find("reward_weights.jugde names no reward component"), std::string::npos) << config_error(c);
  c["reward_weights"] = {{"judge", "high"}};
  EXPECT_NE(config_error(c).find("reward_weights.judge must be a number"), std::string::npos);
  c = env_config(judge_config(), "none");
  c["reward_weights"] = {{"verifier", 1}};
  EXPECT_NE(config_error(c).find("reward_weights.verifier names no reward component"), std::string::npos);
  c.erase("judge");
  EXPECT_NE(config_error(c).find("verifier: none needs 'judge'"), std::string::npos) << config_error(c);
  c["verifier"] = "exact";
  EXPECT_NE(config_error(c).find("'reward_weights' needs 'judge'"), std::string::npos);
  // type: judge needs config.judge
  auto spec = parse_env_spec({{"name", "j"}, {"type", "judge"}, {"config", {{"train", "x.jsonl"}}}}, "envs[0]");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().message.find("envs[0]: a judge env needs config.judge"), std::string::npos);
}

TEST_F(Judge, HttpCallsAndTheirFailures) {
  auto config = detail::read_judge_config(judge_config(0.5), "env dataset");
  ASSERT_TRUE(config.ok()) << config.error().message;
  detail::Judge judge(*config);
  auto s = judge.score("1+1", "2", "2");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_DOUBLE_EQ(s->score, 0.8);
  EXPECT_GT(s->latency_s, 0.0);
  const json sent = json::parse(server_.last_body());
  EXPECT_EQ(sent["model"], "judge-model");
  EXPECT_EQ(sent["messages"][0]["content"], "Q: 1+1\nA: 2\nRef: 2");
  EXPECT_EQ(sent["max_tokens"], 256);
  EXPECT_EQ(sent["temperature"], 0.0);
  EXPECT_EQ(reason(judge.score("p", "GARBAGE", "r")), "judge_parse");
  EXPECT_EQ(reason(judge.score("p", "BIG", "r")), "judge_parse");
  auto http = judge.score("p", "FAIL500", "r");
  EXPECT_EQ(reason(http), "judge_http");
  EXPECT_NE(http.error().message.find("HTTP 500"), std::string::npos) << http.error().message;
  auto hang = judge.score("p", "HANG", "r");
  EXPECT_EQ(reason(hang), "judge_timeout");
  EXPECT_NE(hang.error().message.find("judge.timeout_s 0.5"), std::string::npos) << hang.error().message;
  // an answer past the size bound is cut (judge_http naming it); one dribbled out past timeout_s is
  // a timeout at timeout_s, although every read of it came well within the timeout
  auto huge = detail::Judge(*detail::read_judge_config(judge_config(), "env dataset")).score("p", "HUGE", "r");
  EXPECT_EQ(reason(huge), "judge_http");
  EXPECT_NE(huge.error().message.find("larger than 16 MiB"), std::string::npos) << huge.error().message;
  const auto t0 = std::chrono::steady_clock::now();
  auto drip = judge.score("p", "DRIP", "r");
  EXPECT_EQ(reason(drip), "judge_timeout");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  // the wrong key: 401
  ::setenv("TROUPE_TEST_JUDGE_KEY", "wrong", 1);
  auto unauthorized = detail::Judge(*detail::read_judge_config(judge_config(), "env dataset")).score("p", "r", "a");
  EXPECT_EQ(reason(unauthorized), "judge_http");
  EXPECT_NE(unauthorized.error().message.find("HTTP 401"), std::string::npos) << unauthorized.error().message;
  // nobody listening
  json gone = judge_config();
  gone["url"] = "http://127.0.0.1:1/v1";
  ::setenv("TROUPE_TEST_JUDGE_KEY", "sekret", 1);
  EXPECT_EQ(reason(detail::Judge(*detail::read_judge_config(gone, "env dataset")).score("p", "r", "a")), "judge_http");
  // parse: json
  json j = judge_config();
  j["parse"] = "json";
  j["field"] = "score";
  auto as_json = detail::Judge(*detail::read_judge_config(j, "env dataset")).score("p", "JSON", "a");
  ASSERT_TRUE(as_json.ok()) << as_json.error().message;
  EXPECT_DOUBLE_EQ(as_json->score, 0.7);
}

// In the env: a verifier and a judge are two components, weighted; type: judge is the judge alone;
// a judge failure fails verify with its reason, in-process and in an isolated env worker.
TEST_F(Judge, DatasetEnvWeighsVerifierAndJudge) {
  json c = env_config(judge_config());
  c["reward_weights"] = {{"verifier", 2.0}, {"judge", 0.5}};
  auto env = make_dataset_env(c);
  ASSERT_TRUE(env.ok()) << env.error().message;
  auto obs = (*env)->reset(0, {});
  ASSERT_TRUE(obs.ok()) << obs.error().message;
  const std::string answer = obs->metadata["answer"];
  auto v = (*env)->verify(obs->metadata, "<answer>" + answer + "</answer>");
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_DOUBLE_EQ(v->reward, 2.0 * 1.0 + 0.5 * 0.8);
  EXPECT_EQ(v->components.at("verifier"), 1.0);
  EXPECT_EQ(v->components.at("judge"), 0.8);
  EXPECT_EQ(v->components.at("correct"), 1.0);
  EXPECT_TRUE(v->info.contains("judge_latency_s"));
  EXPECT_NE(server_.last_body().find("Ref: " + answer), std::string::npos) << server_.last_body();
  auto wrong = (*env)->verify(obs->metadata, "<answer>GARBAGE</answer>");
  EXPECT_EQ(reason(wrong), "judge_parse");

  auto spec = parse_env_spec({{"name", "graded"}, {"type", "judge"}, {"isolate", true}, {"timeout_s", 20},
                              {"config", {{"train", (dir_ / "rows.jsonl").string()}, {"eval_fraction", 0.0},
                                          {"judge", judge_config(0.5)}}}},
                             "envs[0]");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->env, "dataset");
  EXPECT_EQ(spec->config["verifier"], "none");
  auto client = make_env_client(*spec);
  ASSERT_TRUE(client.ok()) << client.error().message;
  auto o = (*client)->reset("ep", 1, {});
  ASSERT_TRUE(o.ok()) << o.error().message;
  auto only = (*client)->verify(o->metadata, "anything");
  ASSERT_TRUE(only.ok()) << only.error().message;
  EXPECT_DOUBLE_EQ(only->reward, 0.8);
  EXPECT_EQ(only->components.size(), 1u);
  EXPECT_EQ(reason((*client)->verify(o->metadata, "HANG")), "judge_timeout");
  EXPECT_EQ(reason((*client)->verify(o->metadata, "FAIL500")), "judge_http");
  EXPECT_EQ(reason((*client)->verify(o->metadata, "GARBAGE")), "judge_parse");
  EXPECT_EQ((*client)->restarts(), 0);
}
