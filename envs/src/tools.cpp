// Tool-call parsing: finds <tool_call>{json}</tool_call> blocks; a malformed block becomes a failed
// call whose result tells the model what was wrong (NeMo Gym does the same with invalid tool JSON).
#include "troupe/envs/tools.h"

#include <cctype>

namespace troupe::envs {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<ToolCall> parse_tool_calls(const std::string& text) {
  static const std::string open = "<tool_call>", close = "</tool_call>";
  std::vector<ToolCall> calls;
  size_t pos = 0;
  while ((pos = text.find(open, pos)) != std::string::npos) {
    size_t body = pos + open.size();
    size_t end = text.find(close, body);
    ToolCall call;
    if (end == std::string::npos) {
      call.ok = false;
      call.result = "error: <tool_call> without a closing </tool_call>";
      calls.push_back(std::move(call));
      break;
    }
    json j = json::parse(text.substr(body, end - body), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      call.ok = false;
      call.result = "error: tool call is not a JSON object like {\"name\": ..., \"arguments\": {...}}";
    } else if (!j.contains("name") || !j["name"].is_string()) {
      call.ok = false;
      call.result = "error: tool call has no string \"name\"";
    } else {
      call.name = j["name"].get<std::string>();
      if (j.contains("arguments")) {
        const json& a = j["arguments"];
        if (a.is_object()) {
          call.arguments = a;
        } else if (a.is_string()) {  // some models emit the arguments as a JSON string
          json inner = json::parse(a.get<std::string>(), nullptr, false);
          if (inner.is_object()) {
            call.arguments = inner;
          } else {
            call.ok = false;
            call.result = "error: \"arguments\" must be a JSON object";
          }
        } else {
          call.ok = false;
          call.result = "error: \"arguments\" must be a JSON object";
        }
      }
    }
    calls.push_back(std::move(call));
    pos = end + close.size();
  }
  return calls;
}

std::string format_tool_result(const ToolCall& call) {
  json j = {{"name", call.name}, {call.ok ? "result" : "error", call.result}};
  return "<tool_result>" + j.dump() + "</tool_result>";
}

std::optional<std::string> extract_last_tag(const std::string& text, const std::string& tag) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  size_t start = text.rfind(open);
  if (start == std::string::npos) return std::nullopt;
  size_t body = start + open.size();
  size_t end = text.find(close, body);
  if (end == std::string::npos) return std::nullopt;
  return trim(text.substr(body, end - body));
}

}  // namespace troupe::envs
