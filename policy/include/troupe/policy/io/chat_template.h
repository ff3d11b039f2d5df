// Chat templates: the subset of Jinja that Hugging Face models' chat templates use, rendered the way
// transformers' apply_chat_template(..., tokenize=False) renders them (trim_blocks and lstrip_blocks
// on, tojson keeping key order and non-ASCII text, raise_exception, strftime_now, namespace, loop
// controls). The subset and what is refused are listed in policy/io/README.md ("Chat templates").
// Values are JSON; use nlohmann::ordered_json so that tojson writes keys in the order given.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "troupe/base/result.h"
#include "troupe/policy/io/tokenizer.h"

namespace troupe::policy::io {

namespace jinja {
struct Node;
}

class ChatTemplate {
 public:
  // Parses a template; unsupported syntax is an invalid_input error naming `origin`, the line, the
  // column and the construct.
  static Result<ChatTemplate> parse(std::string_view source, const std::string& origin = "chat template");
  // Renders with `variables` (an object) as the template's context. Errors (raise_exception, a type
  // error, an unknown filter) name origin, line and column.
  Result<std::string> render(const nlohmann::ordered_json& variables) const;
  const std::string& origin() const { return origin_; }

 private:
  std::shared_ptr<const jinja::Node> root_;
  std::string origin_;
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  nlohmann::ordered_json bos_token = nullptr, eos_token = nullptr;  // strings, or null when the model has none
  nlohmann::ordered_json tools = nullptr;                              // a list of JSON schemas, or null
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();     // e.g. {"enable_thinking": false}
};

// What apply_chat_template passes: messages (a list of {role, content, ...}; a message's
// reasoning_content/thinking/reasoning is copied under the names reasoning_content and thinking),
// tools, documents = none, add_generation_prompt, bos_token, eos_token and `extra`.
Result<std::string> render_chat(const ChatTemplate& t, const nlohmann::ordered_json& messages,
                                const ChatRenderOptions& options);

// A model directory's chat template text: chat_template.jinja, else tokenizer_config.json's
// "chat_template" (a string, or a list of {name, template} from which "default" is taken). Empty
// when the directory has none; errors name the file.
Result<std::string> read_chat_template_dir(const std::string& dir);
// The directory's template parsed (origin: the file it came from); nullptr when it has none.
// `dir` may also be a .gguf file: its import's tokenizer_config.json (cached_gguf_import) is read.
Result<std::shared_ptr<const ChatTemplate>> load_chat_template_dir(const std::string& dir);

// Options for a model: bos_token/eos_token are the tokenizer's text of bos_id/eos_id (null when absent).
ChatRenderOptions chat_options_for(const Tokenizer* tokenizer, int32_t bos_id, int32_t eos_id);

}  // namespace troupe::policy::io
