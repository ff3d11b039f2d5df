// Fuzz target: Jinja chat templates (policy/io/chat_template.cpp, policy/io/jinja/). The input is a
// template's source; an accepted one is rendered with a fixed context (system, user, assistant with
// a tool call and reasoning, tool reply, tools, bos/eos, generation prompt).
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "troupe/policy/io/chat_template.h"

namespace {

const nlohmann::ordered_json& messages() {
  static const auto m = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+3? \u00e9\u4e2d"},
    {"role": "assistant", "content": "", "reasoning_content": "add them",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": {"expr": "2+3"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": [{"type": "text", "text": "and 4*4?"}]}
  ])");
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::policy::io;
  auto t = ChatTemplate::parse(troupe::fuzz::as_text(data, size), "fuzz.jinja");
  if (!t.ok()) return 0;
  ChatRenderOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "calc", "description": "evaluate",
          "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}])");
  options.extra = {{"enable_thinking", false}};
  (void)render_chat(*t, messages(), options);
  options.add_generation_prompt = false;
  options.tools = nullptr;
  options.bos_token = nullptr;
  (void)render_chat(*t, nlohmann::ordered_json::array(), options);
  return 0;
}
