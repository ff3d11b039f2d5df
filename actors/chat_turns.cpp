// Chat-format prompts and multi-turn turns (rollout.template chat); the rule is in
// troupe/actors/chat_turns.h. Invariant: sampled tokens stay as sampled, a turn only appends.
#include "troupe/actors/chat_turns.h"

#include <utility>

namespace troupe::actors {

using ojson = nlohmann::ordered_json;

namespace {

// The built-in tags (a model without a chat template): "<|role|>\n" + content + "\n" per message,
// then "<|assistant|>\n"; rendered after the BOS id, as format_prompt writes a prompt.
constexpr const char* kBuiltinTags =
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

// An assistant content no template writes by itself: where it ends in a rendering is where the
// template's closing of the turn starts.
constexpr const char* kAnchorContent = "troupe-assistant-content-7f3a";

Result<std::shared_ptr<const policy::io::ChatTemplate>> builtin_template() {
  static const Result<std::shared_ptr<const policy::io::ChatTemplate>> parsed =
      [] () -> Result<std::shared_ptr<const policy::io::ChatTemplate>> {
    TROUPE_ASSIGN_OR_RETURN(auto t, policy::io::ChatTemplate::parse(kBuiltinTags, "the built-in chat tags"));
    return std::make_shared<const policy::io::ChatTemplate>(std::move(t));
  }();
  return parsed;
}

Result<std::string> render(const ChatFormat& f, const ojson& messages, bool generation_prompt) {
  policy::io::ChatRenderOptions o = f.options;
  o.add_generation_prompt = generation_prompt;
  return policy::io::render_chat(*f.tmpl, messages, o);
}

// What the template writes after an assistant content in [user "x", assistant] + after (the
// closing of the turn, then `after`'s turns and, with generation_prompt, the generation prompt).
Result<std::string> anchor_tail(const ChatFormat& f, const ojson& after, bool generation_prompt) {
  ojson msgs = ojson::array({ojson{{"role", "user"}, {"content", "x"}},
                             ojson{{"role", "assistant"}, {"content", kAnchorContent}}});
  for (const auto& m : after) msgs.push_back(m);
  TROUPE_ASSIGN_OR_RETURN(std::string text, render(f, msgs, generation_prompt));
  const size_t at = text.find(kAnchorContent);
  if (at == std::string::npos)
    return invalid_input(f.tmpl->origin() + ": the template does not write an assistant message's content, "
                         "so multi-turn chat cannot place the env's answers after it");
  return text.substr(at + std::string(kAnchorContent).size());
}

Result<ojson> parse_messages(const std::string& messages_json, const std::string& what) {
  if (messages_json.empty()) return ojson::array();
  ojson m = ojson::parse(messages_json, nullptr, false);
  if (!m.is_array()) return invalid_input(what + ": messages must be a JSON list of {role, content}");
  for (const auto& x : m)
    if (!x.is_object() || !x.contains("role") || !x["role"].is_string() || !x.contains("content"))
      return invalid_input(what + ": each message must be an object with a string role and a content");
  return m;
}

// The assistant's content: sampled[0, n) decoded with special tokens kept; ids the tokenizer lacks
// (a model whose vocabulary is larger than its tokenizer's) are left out of the text only.
Result<std::string> content_text(const policy::io::Tokenizer& tok, const std::vector<int32_t>& sampled, size_t n) {
  std::vector<int32_t> ids(sampled.begin(), sampled.begin() + static_cast<std::ptrdiff_t>(n));
  auto text = tok.decode(ids, /*skip_special=*/false);
  if (text.ok()) return text;
  std::erase_if(ids, [&](int32_t id) { return id < 0 || id >= tok.vocab_size(); });
  return tok.decode(ids, /*skip_special=*/false);
}

}  // namespace

Result<ChatFormat> make_chat_format(const policy::io::Tokenizer& tok,
                                    std::shared_ptr<const policy::io::ChatTemplate> model_template) {
  ChatFormat f;
  f.bos_id = tok.bos_id();
  if (model_template) {
    f.tmpl = std::move(model_template);
    f.options = policy::io::chat_options_for(&tok, tok.bos_id(), tok.eos_id());
  } else {
    TROUPE_ASSIGN_OR_RETURN(f.tmpl, builtin_template());
    f.builtin_tags = true;
  }
  return f;
}

Result<ojson> first_messages(const std::string& system_prompt, const std::string& text,
                             const std::string& messages_json) {
  TROUPE_ASSIGN_OR_RETURN(ojson given, parse_messages(messages_json, "the env's observation"));
  ojson out = ojson::array();
  bool has_system = false;
  for (const auto& m : given) has_system = has_system || m["role"] == "system";
  if (!system_prompt.empty() && !has_system) out.push_back({{"role", "system"}, {"content", system_prompt}});
  if (given.empty()) {
    out.push_back({{"role", "user"}, {"content", text}});
  } else {
    for (auto& m : given) out.push_back(std::move(m));
  }
  return out;
}

Result<ojson> feedback_messages(const std::string& text, const std::string& messages_json,
                                const std::string& info_json) {
  TROUPE_ASSIGN_OR_RETURN(ojson given, parse_messages(messages_json, "the env's step"));
  if (!given.empty()) return given;
  const ojson info = ojson::parse(info_json, nullptr, false);
  const bool tool = info.is_object() && info.contains("tool_calls");
  return ojson::array({ojson{{"role", tool ? "tool" : "user"}, {"content", text}}});
}

Result<std::string> render_prompt(const ChatFormat& f, const ojson& messages) {
  return render(f, messages, true);
}

Result<std::vector<int32_t>> encode_chat_prompt(const ChatFormat& f, const policy::io::Tokenizer& tok,
                                                const ojson& messages) {
  TROUPE_ASSIGN_OR_RETURN(std::string text, render_prompt(f, messages));
  std::vector<int32_t> ids;
  if (f.builtin_tags && f.bos_id >= 0) ids.push_back(f.bos_id);
  TROUPE_ASSIGN_OR_RETURN(auto body, tok.encode(text));
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

Result<ChatConversation> ChatConversation::start(const ChatFormat& f, const policy::io::Tokenizer& tok,
                                                 ojson messages) {
  ChatConversation c;
  c.format_ = f;
  // the end-of-turn token: the closing's first token, when it is a special one (<|im_end|>, <|eot_id|>)
  TROUPE_ASSIGN_OR_RETURN(std::string closing, anchor_tail(f, ojson::array(), false));
  TROUPE_ASSIGN_OR_RETURN(auto ids, tok.encode(closing));
  if (!ids.empty()) {
    auto shown = tok.decode({ids[0]}, /*skip_special=*/true);
    if (shown.ok() && shown->empty()) c.end_of_turn_id_ = ids[0];
  }
  TROUPE_ASSIGN_OR_RETURN(c.text_, render_prompt(f, messages));
  c.messages_ = std::move(messages);
  return c;
}

Result<ChatTurn> ChatConversation::add_turn(const policy::io::Tokenizer& tok, const std::vector<int32_t>& sampled,
                                            const ojson& feedback) {
  ChatTurn turn;
  size_t n = sampled.size();
  const bool ends_turn =
      n > 0 && (sampled.back() == tok.eos_id() || (end_of_turn_id_ >= 0 && sampled.back() == end_of_turn_id_));
  if (ends_turn) --n;  // rule 1
  TROUPE_ASSIGN_OR_RETURN(std::string content, content_text(tok, sampled, n));
  ojson msgs = messages_;
  msgs.push_back({{"role", "assistant"}, {"content", content}});
  for (const auto& m : feedback) msgs.push_back(m);
  // rule 2: the tail from the whole conversation's rendering, else from the anchor's
  TROUPE_ASSIGN_OR_RETURN(std::string full, render(format_, msgs, true));
  std::string head = text_ + content, tail;
  if (full.size() >= head.size() && full.compare(0, head.size(), head) == 0) {
    tail = full.substr(head.size());
  } else {
    TROUPE_ASSIGN_OR_RETURN(tail, anchor_tail(format_, feedback, true));
    turn.rerendered = false;
  }
  // rule 3
  TROUPE_ASSIGN_OR_RETURN(auto ids, tok.encode(tail));
  size_t skip = 0;
  if (ends_turn && !ids.empty() && ids[0] == sampled.back()) {
    ++n;
    skip = 1;
  }
  turn.kept = n;
  turn.appended.assign(ids.begin() + static_cast<std::ptrdiff_t>(skip), ids.end());
  messages_ = std::move(msgs);
  text_ = head + tail;
  return turn;
}

}  // namespace troupe::actors
