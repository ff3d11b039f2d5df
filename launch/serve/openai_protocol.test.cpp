// The OpenAI request checks (every bad field is a 400 naming it) and tool-call parsing of the
// formats chat-template models write (Hermes/Qwen <tool_call> blocks, a Llama 3 JSON reply); the
// strict field checks of troupe serve; the API-key checks (bearer scheme, constant-time compare).
#include <gtest/gtest.h>

#include "troupe/serve/api_keys.h"
#include "troupe/serve/openai_protocol.h"

using namespace troupe::serve;

namespace {
std::string param_of(const std::string& body, bool chat) {
  CompletionRequest r;
  auto e = parse_completion_request(body, chat, 4, &r);
  if (!e) return "<ok>";
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(error_body(*e)["error"]["type"], "invalid_request_error");
  return e->param.empty() ? "<none>" : e->param;
}
}  // namespace

TEST(OpenAiProtocol, RequestFields) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(
      R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
          "max_completion_tokens":5,"temperature":0.5,"top_p":0.9,"seed":-3,"stop":"x","stream":true,
          "stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,"n":2,
          "tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false}})",
      true, 4, &r));
  EXPECT_EQ(r.messages[0]["content"], "ab");
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_EQ(*r.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
  ASSERT_FALSE(parse_completion_request(R"({"model":"m","prompt":[1,2,3],"logprobs":3})", false, 4, &r));
  EXPECT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.top_logprobs, 3);

  EXPECT_EQ(param_of("{not json", false), "<none>");
  EXPECT_EQ(param_of("[1]", false), "<none>");
  EXPECT_EQ(param_of(R"({"prompt":"x"})", false), "model");
  EXPECT_EQ(param_of(R"({"model":"m"})", false), "prompt");
  EXPECT_EQ(param_of(R"({"model":"m","prompt":{}})", false), "prompt");
  EXPECT_EQ(param_of(R"({"model":"m","prompt":"x","max_tokens":0})", false), "max_tokens");
  EXPECT_EQ(param_of(R"({"model":"m","prompt":"x","max_tokens":"5"})", false), "max_tokens");
  EXPECT_EQ(param_of(R"({"model":"m","prompt":"x","temperature":-0.1})", false), "temperature");
  EXPECT_EQ(param_of(R"({"model":"m","prompt":"x","top_p":0})", false), "top_p");
  EXPECT_EQ(param_of(R"({"model":"m","prompt":"x","n":5})", false), "n");
  EXPECT_EQ(param_of(R"({"model":"m","prompt":"x","stop":[1]})", false), "stop");
  EXPECT_EQ(param_of(R"({"model":"m","prompt":"x","stop":""})", false), "stop");
  EXPECT_EQ(param_of(R"({"model":"m","prompt":"x","seed":1.5})", false), "seed");
  EXPECT_EQ(param_of(R"({"model":"m","prompt":"x","stream":"yes"})", false), "stream");
  EXPECT_EQ(param_of(R"({"model":"m","messages":[]})", true), "messages");
  EXPECT_EQ(param_of(R"({"model":"m","messages":[{"content":"x"}]})", true), "messages[0].role");
  EXPECT_EQ(param_of(R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true),
            "messages[0].content[0]");
  EXPECT_EQ(param_of(R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":{}})", true), "tools");
  EXPECT_EQ(param_of(R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2})", true),
            "top_logprobs");
  EXPECT_EQ(param_of(R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":-1})", true),
            "max_completion_tokens");
}

TEST(OpenAiProtocol, ToolCalls) {
  auto q = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
      "call_");
  ASSERT_EQ(q.calls.size(), 2u);
  EXPECT_EQ(q.content, "Let me check.");
  EXPECT_EQ(q.calls[0]["id"], "call_0");
  EXPECT_EQ(q.calls[0]["type"], "function");
  EXPECT_EQ(q.calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(q.calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  EXPECT_EQ(q.calls[1]["function"]["name"], "get_time");
  // An unterminated block at the end of a truncated reply still parses when its JSON is whole.
  EXPECT_EQ(parse_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}", "c").calls.size(), 1u);
  // Llama 3: the whole reply is a JSON call with "parameters".
  auto l = parse_tool_calls(" {\"name\": \"f\", \"parameters\": {\"x\": \"y\"}}", "c");
  ASSERT_EQ(l.calls.size(), 1u);
  EXPECT_EQ(l.calls[0]["function"]["arguments"], "{\"x\":\"y\"}");
  EXPECT_EQ(l.content, "");
  // Not calls: plain text, broken JSON, JSON without a name.
  EXPECT_TRUE(parse_tool_calls("just text", "c").calls.empty());
  EXPECT_EQ(parse_tool_calls("just text", "c").content, "just text");
  EXPECT_TRUE(parse_tool_calls("<tool_call>{oops</tool_call>", "c").calls.empty());
  EXPECT_TRUE(parse_tool_calls("{\"a\": 1}", "c").calls.empty());
}

TEST(OpenAiProtocol, PartialMarker) {
  EXPECT_EQ(partial_marker_start("hello <tool", "<tool_call>"), 6u);
  EXPECT_EQ(partial_marker_start("hello", "<tool_call>"), 5u);
  EXPECT_EQ(partial_marker_start("ab", "b"), 2u);  // a whole one-character marker is not partial
  EXPECT_EQ(partial_marker_start("xxST", "STOP"), 2u);
}

// strict (troupe serve): an unknown field, or a known one asking for what is not implemented, is a
// 400 naming it; the fields OpenAI clients send routinely pass when they ask for nothing.
TEST(OpenAiProtocol, StrictFields) {
  auto strict = [](const std::string& body, bool chat) {
    CompletionRequest r;
    auto e = parse_completion_request(body, chat, 4, &r, true);
    return e ? e->param : std::string("<ok>");
  };
  const std::string m = R"("model":"m","messages":[{"role":"user","content":"a"}])";
  EXPECT_EQ(strict("{" + m + R"(,"user":"u","seed":1,"n":1,"stream_options":{"include_usage":true},"store":false,
      "metadata":{},"parallel_tool_calls":true,"frequency_penalty":0,"presence_penalty":0.0,"logit_bias":{},
      "response_format":{"type":"text"},"tool_choice":"auto"})", true), "<ok>");
  EXPECT_EQ(strict("{" + m + R"(,"foo":1})", true), "foo");
  EXPECT_EQ(strict("{" + m + R"(,"frequency_penalty":0.5})", true), "frequency_penalty");
  EXPECT_EQ(strict("{" + m + R"(,"logit_bias":{"1":2}})", true), "logit_bias");
  EXPECT_EQ(strict("{" + m + R"(,"tool_choice":"required"})", true), "tool_choice");
  EXPECT_EQ(strict("{" + m + R"(,"response_format":{"type":"xml"}})", true), "response_format");
  EXPECT_EQ(strict("{" + m + R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","minProperties":1}}}})", true),
            "response_format");
  EXPECT_EQ(strict(R"({"model":"m","prompt":"x","echo":true})", false), "echo");
  EXPECT_EQ(strict(R"({"model":"m","prompt":"x","best_of":1,"echo":false,"suffix":""})", false), "<ok>");
  EXPECT_EQ(strict(R"({"model":"m","prompt":"x","messages":[]})", false), "messages");
  CompletionRequest r;  // lenient (rollout.serve): the same unknown field is ignored
  EXPECT_FALSE(parse_completion_request("{" + m + R"(,"foo":1,"response_format":{"type":"json_object"}})", true, 4, &r));
  EXPECT_FALSE(r.json_object);
  ASSERT_FALSE(parse_completion_request("{" + m + R"(,"response_format":{"type":"json_object"}})", true, 4, &r, true));
  EXPECT_TRUE(r.json_object);
}

TEST(ApiKeys, BearerAndConstantTimeCompare) {
  const std::vector<std::string> keys = {"sk-one", "sk-two-longer"};
  EXPECT_TRUE(bearer_matches("Bearer sk-one", keys));
  EXPECT_TRUE(bearer_matches("bearer sk-two-longer ", keys));
  for (const char* h : {"", "Bearer", "Bearer ", "Bearer sk-on", "Bearer sk-one1", "Basic sk-one", "sk-one",
                        "Bearer SK-ONE", "Bearer  sk-one"})
    EXPECT_FALSE(bearer_matches(h, keys)) << h;
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abc", "abd"));
  EXPECT_FALSE(constant_time_equal("abc", "ab"));
  EXPECT_FALSE(constant_time_equal(std::string("a\0", 2), "a"));
  EXPECT_FALSE(read_api_key_file("/nonexistent/keys").ok());
}
