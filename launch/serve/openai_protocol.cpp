// OpenAI request checking, tool-call parsing and error bodies for `troupe serve` (openai_protocol.h).
#include "troupe/serve/openai_protocol.h"

#include <cmath>
#include <set>

namespace troupe::serve {

ojson error_body(const ApiError& e) {
  ojson err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return ojson{{"error", err}};
}

namespace {

ApiError bad(const std::string& param, const std::string& message) { return ApiError{400, message, param}; }

// A number field: absent or null keeps *out.
std::optional<ApiError> number_field(const ojson& j, const char* key, float* out, float lo, float hi,
                                     bool lo_open = false) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number()) return bad(key, std::string("'") + key + "' must be a number");
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v <= lo))
    return bad(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + std::to_string(lo) + ", " +
                        std::to_string(hi) + "], got " + j[key].dump());
  *out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> int_field(const ojson& j, const char* key, int* out, long long lo, long long hi) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number_integer())
    return bad(key, std::string("'") + key + "' must be an integer, got " + j[key].dump());
  const long long v = j[key].get<long long>();
  if (v < lo || v > hi)
    return bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        "], got " + std::to_string(v));
  *out = static_cast<int>(v);
  return std::nullopt;
}

std::optional<ApiError> bool_field(const ojson& j, const char* key, bool* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_boolean()) return bad(key, std::string("'") + key + "' must be true or false, got " + j[key].dump());
  *out = j[key].get<bool>();
  return std::nullopt;
}

// A message's content as text: a string, null, or a list of {"type": "text", "text": ...} parts.
std::optional<ApiError> content_text(const ojson& content, const std::string& where, ojson* out) {
  if (content.is_null() || content.is_string()) {
    *out = content;
    return std::nullopt;
  }
  if (!content.is_array()) return bad(where, "'" + where + "' must be a string or a list of text parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      return bad(at, "'" + at + "' must be {\"type\": \"text\", \"text\": ...} (this model reads text only)");
    text += part["text"].get<std::string>();
  }
  *out = text;
  return std::nullopt;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// {"name": ..., "arguments"|"parameters": ...} as an OpenAI tool call; nullopt when it is not one.
std::optional<ojson> tool_call_of(const std::string& json_text, const std::string& id) {
  ojson j;
  try {
    j = ojson::parse(json_text);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ojson args = j.contains("arguments") ? j["arguments"] : j.contains("parameters") ? j["parameters"] : ojson::object();
  const std::string arg_text = args.is_string() ? args.get<std::string>() : args.dump();
  return ojson{{"id", id}, {"type", "function"}, {"function", {{"name", j["name"]}, {"arguments", arg_text}}}};
}

// The chat messages, each content made text (templates test `'x' in message.content`) and each
// assistant tool call's arguments parsed back to JSON (templates read them as objects).
std::optional<ApiError> chat_messages(const ojson& j, ojson* out) {
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
    return bad("messages", "'messages' must be a non-empty list of {\"role\", \"content\"}");
  *out = ojson::array();
  for (size_t i = 0; i < j["messages"].size(); ++i) {
    ojson m = j["messages"][i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return bad(at + ".role", "'" + at + "' must be an object with a 'role' string");
    if (m.contains("content")) {
      ojson text;
      if (auto e = content_text(m["content"], at + ".content", &text)) return e;
      m["content"] = text.is_null() ? ojson("") : text;  // templates test `'x' in message.content`
    } else {
      m["content"] = "";  // e.g. an assistant turn that only calls tools
    }
    if (m.contains("tool_calls") && m["tool_calls"].is_array())  // templates read arguments as JSON
      for (auto& c : m["tool_calls"])
        if (c.is_object() && c.contains("function") && c["function"].is_object() &&
            c["function"].contains("arguments") && c["function"]["arguments"].is_string()) {
          try {
            c["function"]["arguments"] = ojson::parse(c["function"]["arguments"].get<std::string>());
          } catch (const nlohmann::json::exception&) {  // not JSON: the template gets the string
          }
        }
    out->push_back(std::move(m));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_completion_request(const std::string& body, bool chat, int max_n,
                                                 CompletionRequest* out, bool strict) {
  CompletionRequest r;
  r.chat = chat;
  ojson j;
  try {
    j = ojson::parse(body);
  } catch (const nlohmann::json::exception& e) {
    return ApiError{400, std::string("the request body is not valid JSON: ") + e.what(), ""};
  }
  if (!j.is_object()) return ApiError{400, "the request body must be a JSON object", ""};
  if (strict)
    if (auto e = strict_field_error(j, chat)) return e;
  if (!j.contains("model") || !j["model"].is_string()) return bad("model", "'model' (a string) is required");
  r.model = j["model"].get<std::string>();
  if (chat) {
    if (auto e = chat_messages(j, &r.messages)) return e;
    r.tools = nullptr;
    if (j.contains("tools") && !j["tools"].is_null()) {
      if (!j["tools"].is_array()) return bad("tools", "'tools' must be a list of {\"type\": \"function\", ...}");
      for (size_t i = 0; i < j["tools"].size(); ++i)
        if (!j["tools"][i].is_object())
          return bad("tools[" + std::to_string(i) + "]", "every tool must be an object");
      if (!j["tools"].empty()) r.tools = j["tools"];
    }
    if (j.contains("tool_choice") && j["tool_choice"].is_string() && j["tool_choice"] == "none") r.tools = nullptr;
    if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
      if (!j["chat_template_kwargs"].is_object())
        return bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      r.template_kwargs = j["chat_template_kwargs"];
    }
    if (auto e = bool_field(j, "logprobs", &r.logprobs)) return e;
    if (auto e = int_field(j, "top_logprobs", &r.top_logprobs, 0, 20)) return e;
    if (r.top_logprobs > 0 && !r.logprobs) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (strict && j.contains("response_format") && j["response_format"].is_object()) {  // checked by strict_field_error
      const ojson& f = j["response_format"];
      r.json_object = f.value("type", "") == "json_object";
      if (f.value("type", "") == "json_schema") r.json_schema = *compile_json_schema(f["json_schema"]["schema"]);
    }
  } else {
    if (!j.contains("prompt")) return bad("prompt", "'prompt' is required");
    const ojson& p = j["prompt"];
    if (p.is_string()) {
      r.prompt_text = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt_text = p[0].get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      r.prompt_is_tokens = true;
      for (size_t i = 0; i < p.size(); ++i) {
        if (!p[i].is_number_integer() || p[i].get<long long>() < 0 || p[i].get<long long>() > INT32_MAX)
          return bad("prompt", "'prompt[" + std::to_string(i) + "]' must be a token id, got " + p[i].dump());
        r.prompt_tokens.push_back(static_cast<int32_t>(p[i].get<long long>()));
      }
    } else {
      return bad("prompt", "'prompt' must be a string, a list of one string, or a list of token ids");
    }
    if (j.contains("logprobs") && !j["logprobs"].is_null()) {
      if (auto e = int_field(j, "logprobs", &r.top_logprobs, 0, 20)) return e;
      r.logprobs = true;
    }
  }
  int max_tokens = 0;
  const char* mt_key = chat && j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null()
                           ? "max_completion_tokens"
                           : "max_tokens";
  if (j.contains(mt_key) && !j[mt_key].is_null()) {
    if (auto e = int_field(j, mt_key, &max_tokens, 1, 1 << 24)) return e;
    r.max_tokens = max_tokens;
    r.max_tokens_field = mt_key;
  }
  if (auto e = number_field(j, "temperature", &r.temperature, 0.0f, 100.0f)) return e;
  if (auto e = number_field(j, "top_p", &r.top_p, 0.0f, 1.0f, true)) return e;
  if (auto e = int_field(j, "top_k", &r.top_k, -1, 1 << 24)) return e;
  if (r.top_k < 0) r.top_k = 0;
  if (auto e = int_field(j, "n", &r.n, 1, max_n)) return e;
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!j["seed"].is_number_integer()) return bad("seed", "'seed' must be an integer, got " + j["seed"].dump());
    r.seed = j["seed"].is_number_unsigned() ? j["seed"].get<uint64_t>()
                                            : static_cast<uint64_t>(j["seed"].get<int64_t>());
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const ojson& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const auto& x : s) {
        if (!x.is_string()) return bad("stop", "'stop' must be a string or a list of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or a list of strings");
    }
    for (const auto& x : r.stop)
      if (x.empty()) return bad("stop", "'stop' strings must not be empty");
  }
  if (auto e = bool_field(j, "stream", &r.stream)) return e;
  if (j.contains("stream_options") && j["stream_options"].is_object())
    if (auto e = bool_field(j["stream_options"], "include_usage", &r.include_usage)) return e;
  if (auto e = bool_field(j, "ignore_eos", &r.ignore_eos)) return e;
  *out = std::move(r);
  return std::nullopt;
}

namespace {

// Fields read (or accepted and ignored) in strict mode, per route.
const std::set<std::string>& known_fields(bool chat) {
  static const std::set<std::string> common = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop", "stream", "stream_options",
      "logprobs", "ignore_eos", "user", "frequency_penalty", "presence_penalty", "logit_bias"};
  static const std::set<std::string> chat_fields = [] {
    std::set<std::string> s = common;
    for (const char* k : {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                          "parallel_tool_calls", "chat_template_kwargs", "response_format", "metadata", "store",
                          "service_tier"})
      s.insert(k);
    return s;
  }();
  static const std::set<std::string> completion_fields = [] {
    std::set<std::string> s = common;
    for (const char* k : {"prompt", "echo", "best_of", "suffix"}) s.insert(k);
    return s;
  }();
  return chat ? chat_fields : completion_fields;
}

ApiError not_implemented(const std::string& param, const std::string& what) {
  return bad(param, what + " is not implemented by this server (troupe serve); leave '" + param + "' out");
}

// A field that is accepted only with a value that asks for nothing (0, false, {}, 1, null, "").
std::optional<ApiError> no_op_value(const ojson& j, const char* key, const ojson& allowed) {
  if (!j.contains(key) || j[key].is_null() || j[key] == allowed) return std::nullopt;
  return not_implemented(key, std::string("'") + key + "': " + j[key].dump());
}

std::optional<ApiError> response_format_error(const ojson& j) {
  if (!j.contains("response_format") || j["response_format"].is_null()) return std::nullopt;
  const ojson& f = j["response_format"];
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    return bad("response_format", "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
  const std::string type = f["type"].get<std::string>();
  if (type == "text" || type == "json_object") return std::nullopt;
  if (type == "json_schema") {
    if (!f.contains("json_schema") || !f["json_schema"].is_object() || !f["json_schema"].contains("schema"))
      return bad("response_format", "response_format.json_schema must be {\"name\": ..., \"schema\": {...}}");
    if (auto c = compile_json_schema(f["json_schema"]["schema"]); !c.ok())
      return bad("response_format", "response_format.json_schema." + c.error().message);
    return std::nullopt;
  }
  return bad("response_format", "'response_format.type' must be text, json_object or json_schema, got " + f["type"].dump());
}

std::optional<ApiError> tool_choice_error(const ojson& j) {
  if (!j.contains("tool_choice") || j["tool_choice"].is_null()) return std::nullopt;
  const ojson& c = j["tool_choice"];
  if (c.is_string() && (c == "none" || c == "auto")) return std::nullopt;
  if (c.is_string() && c == "required") return not_implemented("tool_choice", "tool_choice 'required'");
  if (c.is_object()) return not_implemented("tool_choice", "forcing a named tool");
  return bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}");
}

}  // namespace

std::optional<ApiError> strict_field_error(const ojson& j, bool chat) {
  const auto& known = known_fields(chat);
  for (const auto& [key, value] : j.items())
    if (!known.count(key))
      return bad(key, "'" + key + "' is not a field this server reads (" + std::string(chat ? "/v1/chat/completions" :
                      "/v1/completions") + "; docs/serving.md lists them)");
  for (const char* k : {"frequency_penalty", "presence_penalty"})
    if (auto e = no_op_value(j, k, 0)) return e;
  if (j.contains("logit_bias") && !j["logit_bias"].is_null() && j["logit_bias"] != ojson::object())
    return not_implemented("logit_bias", "'logit_bias'");
  if (chat) {
    if (auto e = response_format_error(j)) return e;
    return tool_choice_error(j);
  }
  if (auto e = no_op_value(j, "echo", false)) return e;
  if (auto e = no_op_value(j, "best_of", 1)) return e;
  return no_op_value(j, "suffix", "");
}

ToolCallParse parse_tool_calls(const std::string& text, const std::string& id_prefix) {
  ToolCallParse out;
  static const std::string open = "<tool_call>", close = "</tool_call>";
  std::string content;
  size_t at = 0;
  for (;;) {
    const size_t b = text.find(open, at);
    if (b == std::string::npos) break;
    size_t e = text.find(close, b + open.size());
    const size_t body_end = e == std::string::npos ? text.size() : e;
    auto call = tool_call_of(trim(text.substr(b + open.size(), body_end - b - open.size())),
                             id_prefix + std::to_string(out.calls.size()));
    if (!call) break;  // not a call: the rest stays content
    content += text.substr(at, b - at);
    out.calls.push_back(std::move(*call));
    at = e == std::string::npos ? text.size() : e + close.size();
  }
  content += text.substr(at);
  if (out.calls.empty()) {  // Llama 3 style: the whole reply is one JSON call
    const std::string t = trim(text);
    if (!t.empty() && t.front() == '{')
      if (auto call = tool_call_of(t, id_prefix + "0")) {
        out.calls.push_back(std::move(*call));
        content.clear();
      }
  }
  out.content = out.calls.empty() ? text : trim(content);
  return out;
}

size_t partial_marker_start(const std::string& text, const std::string& marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.compare(text.size() - n, n, marker, 0, n) == 0) return text.size() - n;
  return text.size();
}

}  // namespace troupe::serve
