// The OpenAI API's request and response shapes for `troupe serve` (launch/serve/openai_protocol.cpp):
// a chat or text completion request checked field by field (a bad field is a 400 naming it),
// tool calls parsed out of a completion's text the way chat-template models write them, and the
// OpenAI-shaped error body. No HTTP and no model here: openai_server.cpp does both.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/serve/json_schema.h"

namespace troupe::serve {

using ojson = nlohmann::ordered_json;

// A request refused: HTTP status, OpenAI error type and the request field at fault (may be empty).
struct ApiError {
  ApiError() = default;
  ApiError(int status_, std::string message_, std::string param_, std::string type_ = "invalid_request_error",
           std::string code_ = {})
      : status(status_), message(std::move(message_)), param(std::move(param_)), type(std::move(type_)),
        code(std::move(code_)) {}
  int status = 400;
  std::string message;
  std::string param;
  std::string type = "invalid_request_error";
  std::string code;  // OpenAI's error code (e.g. model_not_found, invalid_api_key); "" = null
};
ojson error_body(const ApiError& e);

struct CompletionRequest {
  bool chat = false;
  std::string model;
  ojson messages;                      // chat: the list of {role, content, ...}, content made text
  ojson tools;                         // chat: null or the list of tools given to the template
  ojson template_kwargs = ojson::object();  // chat: extra template variables (chat_template_kwargs)
  std::string prompt_text;             // completions: the prompt as text ...
  std::vector<int32_t> prompt_tokens;  // ... or as token ids
  bool prompt_is_tokens = false;
  std::optional<int> max_tokens;       // absent: the server's default
  std::string max_tokens_field = "max_tokens";  // or max_completion_tokens (chat), for errors
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  int n = 1;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;
  bool ignore_eos = false;     // sampling goes on past EOS (a vLLM extension; benchmarks use it)
  bool json_object = false;    // chat, strict: response_format json_object (constrained decoding)
  std::shared_ptr<const JsonSchema> json_schema;  // chat, strict: response_format json_schema's, compiled
};

// Parses and checks a /v1/chat/completions (chat = true) or /v1/completions body. strict (`troupe
// serve`): a field this server does not read is a 400 naming it, except those OpenAI clients send
// routinely, which are accepted when they ask for nothing this server would have to do
// (strict_field_error); rollout.serve parses leniently (other fields ignored).
std::optional<ApiError> parse_completion_request(const std::string& body, bool chat, int max_n,
                                                 CompletionRequest* out, bool strict = false);

// strict mode's field check of a request object: unknown fields, and known ones asking for what is
// not implemented (a response_format json_schema outside the supported subset, tool_choice required or a function,
// non-zero penalties, a logit_bias, echo, best_of > 1, suffix) are a 400 naming the field.
std::optional<ApiError> strict_field_error(const ojson& request, bool chat);

// Tool calls in a completion's text: Hermes/Qwen style <tool_call>{"name": ..., "arguments": ...}</tool_call>
// blocks, or a whole reply that is one JSON object {"name": ..., "arguments"|"parameters": {...}}
// (Llama 3). `content` is the text outside the calls (trimmed), `calls` the OpenAI tool_calls list
// (id, type function, function {name, arguments as a JSON string}); empty when there is none.
struct ToolCallParse {
  std::string content;
  ojson calls = ojson::array();
};
ToolCallParse parse_tool_calls(const std::string& text, const std::string& id_prefix);

// Where a text could still turn into `marker` once more text follows: the start of the longest
// suffix of `text` that is a prefix of `marker`, else text.size(). Streaming holds that part back.
size_t partial_marker_start(const std::string& text, const std::string& marker);

}  // namespace troupe::serve
