// The public chat-template API (chat_template.h): parse and render a template, render a conversation
// the way transformers' apply_chat_template does, and find a model directory's template. The Jinja
// subset itself lives in jinja/ (values, lexer, parser, renderer, built-ins, filters).
// Invariant: jinja/ throws TemplateError; it is caught here and every public function returns a Result.
#include "troupe/policy/io/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "jinja/parser.h"
#include "jinja/renderer.h"
#include "troupe/policy/io/gguf_import.h"

namespace troupe::policy::io {

namespace {

Error as_error(const std::string& origin, const jinja::TemplateError& t) {
  std::string where = origin;
  if (t.line > 0) where.append(":").append(std::to_string(t.line)).append(":").append(std::to_string(t.col));
  return invalid_input(where + ": " + t.message);
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string_view source, const std::string& origin) {
  try {
    auto root = std::make_shared<jinja::Node>();
    root->k = jinja::Node::K::body;
    root->body = jinja::parse_template(source);
    ChatTemplate t;
    t.root_ = std::move(root);
    t.origin_ = origin;
    return t;
  } catch (const jinja::TemplateError& e) {
    return as_error(origin, e);
  }
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object()) return invalid_input(origin_ + ": template variables must be a JSON object");
  try {
    return jinja::render_template(root_->body, variables);
  } catch (const jinja::TemplateError& e) {
    return as_error(origin_, e);
  }
}

Result<std::string> render_chat(const ChatTemplate& t, const nlohmann::ordered_json& messages,
                                const ChatRenderOptions& o) {
  if (!messages.is_array()) return invalid_input(t.origin() + ": messages must be a JSON list");
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) return invalid_input(t.origin() + ": each message must be a JSON object");
    nlohmann::ordered_json reasoning;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (m.contains(key) && !m[key].is_null()) { reasoning = m[key]; break; }
    if (reasoning.is_null()) { msgs.push_back(m); continue; }
    nlohmann::ordered_json aliased = {{"thinking", reasoning}};  // transformers: {"thinking": r, **m, "reasoning_content": r}
    for (auto it = m.begin(); it != m.end(); ++it) aliased[it.key()] = it.value();
    aliased["reasoning_content"] = reasoning;
    msgs.push_back(std::move(aliased));
  }
  nlohmann::ordered_json vars = {{"messages", msgs}, {"tools", o.tools}, {"documents", nullptr},
                                 {"add_generation_prompt", o.add_generation_prompt},
                                 {"bos_token", o.bos_token}, {"eos_token", o.eos_token}};
  for (auto it = o.extra.begin(); it != o.extra.end(); ++it) vars[it.key()] = it.value();
  return t.render(vars);
}

Result<std::string> read_chat_template_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path jinja_file = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja_file)) {
    std::ifstream in(jinja_file, std::ios::binary);
    if (!in) return invalid_input(jinja_file.string() + ": cannot read");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  const fs::path cfg = fs::path(dir) / "tokenizer_config.json";
  if (!fs::exists(cfg)) return std::string();
  nlohmann::json j;
  try {
    std::ifstream in(cfg);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return invalid_input(cfg.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("chat_template") || j["chat_template"].is_null()) return std::string();
  const auto& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const auto& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        return e["template"].get<std::string>();
    return invalid_input(cfg.string() + ": chat_template is a list without a \"default\" entry");
  }
  return invalid_input(cfg.string() + ": chat_template must be a string or a list of {name, template}");
}

Result<std::shared_ptr<const ChatTemplate>> load_chat_template_dir(const std::string& path) {
  // a GGUF's template is in its import's tokenizer_config.json
  TROUPE_ASSIGN_OR_RETURN(std::string dir, model_dir_for(path));
  TROUPE_ASSIGN_OR_RETURN(std::string text, read_chat_template_dir(dir));
  if (text.empty()) return std::shared_ptr<const ChatTemplate>();
  namespace fs = std::filesystem;
  const std::string origin = fs::exists(fs::path(dir) / "chat_template.jinja")
                                 ? (fs::path(dir) / "chat_template.jinja").string()
                                 : (fs::path(dir) / "tokenizer_config.json").string() + " chat_template";
  TROUPE_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::parse(text, origin));
  return std::shared_ptr<const ChatTemplate>(std::make_shared<ChatTemplate>(std::move(t)));
}

ChatRenderOptions chat_options_for(const Tokenizer* tokenizer, int32_t bos_id, int32_t eos_id) {
  ChatRenderOptions o;
  auto text = [&](int32_t id) -> nlohmann::ordered_json {
    if (!tokenizer || id < 0) return nullptr;
    auto s = tokenizer->decode({id}, /*skip_special=*/false);
    return s.ok() ? nlohmann::ordered_json(*s) : nlohmann::ordered_json(nullptr);
  };
  o.bos_token = text(bos_id);
  o.eos_token = text(eos_id);
  return o;
}

}  // namespace troupe::policy::io
