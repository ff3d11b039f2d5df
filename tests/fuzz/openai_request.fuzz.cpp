// Fuzz target: OpenAI-compatible request bodies (launch/serve/openai_protocol.cpp, json_schema.cpp):
// the input is a /v1/chat/completions or /v1/completions body, parsed both ways, strict (`troupe
// serve`) and lenient (rollout.serve); a response_format json_schema is compiled on the way. A
// compiled schema's byte-wise prefix checker runs over the body, and what it calls a complete
// document must be JSON; the body is also read as a model reply holding tool calls.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_input.h"
#include "troupe/serve/json_schema.h"
#include "troupe/serve/openai_protocol.h"

namespace {

using namespace troupe::serve;

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// Feeds `text` to the prefix checker; a text it accepts as complete must parse as JSON. (The checker
// passes any byte >= 0x80 inside strings, leaving UTF-8 to the tokenizer, so only UTF-8 texts count.)
void check_prefix(const JsonSchema* schema, const std::string& text) {
  SchemaPrefix p(schema);
  for (unsigned char c : text)
    if (!p.feed(c)) return;
  if (p.complete() && valid_utf8(text) && nlohmann::json::parse(text, nullptr, false).is_discarded()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(troupe::fuzz::as_text(data, size));
  for (bool chat : {true, false}) {
    for (bool strict : {true, false}) {
      CompletionRequest req;
      if (parse_completion_request(body, chat, /*max_n=*/8, &req, strict)) continue;  // a 400
      if (req.json_schema) {
        check_prefix(req.json_schema.get(), body);
        check_prefix(req.json_schema.get(), R"({"answer": "5", "steps": [1, 2.5e3, true, null], "ok": false})");
      }
    }
  }
  const auto schema = nlohmann::ordered_json::parse(body, nullptr, false);
  if (!schema.is_discarded()) {
    if (auto compiled = compile_json_schema(schema); compiled.ok()) check_prefix(compiled->get(), body);
  }
  check_prefix(JsonSchema::any_object().get(), body);
  (void)parse_tool_calls(body, "call_");
  return 0;
}
