// Tool calls in model output. The syntax (documented in envs/README.md) is Hermes/Qwen style:
//   <tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>
// Each call is one JSON object between the tags; results go back to the model as
//   <tool_result>{"name": "calculator", "result": "84"}</tool_result>
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "troupe/envs/env.h"

namespace troupe::envs {

// Every <tool_call>...</tool_call> block in `text`, in order. A block whose body is not a JSON
// object with a string "name" (and an object "arguments", if present) comes back with ok=false and
// `result` saying what is wrong, so the env can show the model its mistake instead of failing.
std::vector<ToolCall> parse_tool_calls(const std::string& text);

// The text shown to the model for one executed call.
std::string format_tool_result(const ToolCall& call);

// The contents of the last <TAG>...</TAG> in text (trimmed), or nullopt when there is none.
std::optional<std::string> extract_last_tag(const std::string& text, const std::string& tag);

std::string trim(const std::string& s);

}  // namespace troupe::envs
