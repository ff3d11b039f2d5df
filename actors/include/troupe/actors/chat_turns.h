// Chat-format prompts and multi-turn turns (rollout.template chat): the first prompt rendered from
// the env's messages, each later turn's tokens taken from the chat template's own rendering of the
// conversation. Invariant: sampled tokens are never re-tokenized; only the new turn's tokens are
// appended, and where the template allows, the context equals a full re-render token for token.
//
// The rule, per turn (ChatConversation::add_turn), with `text` the rendered text the context holds:
//  1. The sample's last token, when it is the tokenizer's EOS or the template's end-of-turn token,
//     is not part of the assistant's content; content = the other sampled tokens, decoded with
//     special tokens kept.
//  2. full = render(messages + [assistant content] + feedback messages, add_generation_prompt).
//     When full starts with text + content, the tail X = the rest of full (the assistant turn's
//     closing, the feedback turns, the generation prompt). Otherwise the template renders earlier
//     turns otherwise than the context holds them (Qwen3 drops the reasoning of earlier turns,
//     Llama trims contents): X = what the template puts after an assistant content in the anchor
//     conversation [user "x", assistant content] + feedback messages, and the turn counts as
//     not re-rendered (ChatTurn::rerendered; the run log counts such turns per step).
//  3. X is tokenized alone. When the sample's last token equals X's first token it stays (mask 1,
//     the model learns to end its turn) and X's other tokens follow; else an EOS is dropped (as in
//     the plain format) and all of X follows (mask 0).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/policy/io/chat_template.h"
#include "troupe/policy/io/tokenizer.h"

namespace troupe::actors {

// How a run renders chat: the model's template (which places BOS itself), or, for a model without
// one, the built-in <|system|>/<|user|>/<|assistant|> tags after the BOS id.
struct ChatFormat {
  std::shared_ptr<const policy::io::ChatTemplate> tmpl;
  bool builtin_tags = false;   // BOS id first, then the rendering
  int32_t bos_id = -1;
  policy::io::ChatRenderOptions options;  // bos_token/eos_token: the tokenizer's text of its ids
};
// The format for a tokenizer and the model's template (null: the built-in tags).
Result<ChatFormat> make_chat_format(const policy::io::Tokenizer& tok,
                                    std::shared_ptr<const policy::io::ChatTemplate> model_template);

// The first prompt's conversation: the env's messages (messages_json, a JSON list of {role,
// content}) when it gave any, else its text as one user turn; rollout.system_prompt goes first when
// it is set and the messages have no system message. A malformed list is an error.
Result<nlohmann::ordered_json> first_messages(const std::string& system_prompt, const std::string& text,
                                              const std::string& messages_json);
// The env's answer to a turn as chat messages: the step's messages when it gave any, else its text
// as one turn of role `tool` when the step's info has "tool_calls", else `user`.
Result<nlohmann::ordered_json> feedback_messages(const std::string& text, const std::string& messages_json,
                                                 const std::string& info_json);

// The conversation rendered with the generation prompt, and its token ids (BOS id first for the
// built-in tags; otherwise encoded without adding BOS/EOS).
Result<std::string> render_prompt(const ChatFormat& f, const nlohmann::ordered_json& messages);
Result<std::vector<int32_t>> encode_chat_prompt(const ChatFormat& f, const policy::io::Tokenizer& tok,
                                                const nlohmann::ordered_json& messages);

// What one turn adds to an episode's context: sampled[0, kept) as sampled, then `appended` (mask 0).
struct ChatTurn {
  size_t kept = 0;
  std::vector<int32_t> appended;
  bool rerendered = true;  // false: rule 2's anchor was used (the template rewrites earlier turns)
};

// One episode's conversation: its messages and the rendered text its context holds.
class ChatConversation {
 public:
  // An error when the template does not write an assistant message's content.
  static Result<ChatConversation> start(const ChatFormat& f, const policy::io::Tokenizer& tok,
                                        nlohmann::ordered_json messages);
  // The assistant's turn (its sampled tokens) and the env's answer (feedback_messages) added.
  Result<ChatTurn> add_turn(const policy::io::Tokenizer& tok, const std::vector<int32_t>& sampled,
                            const nlohmann::ordered_json& feedback);
  const nlohmann::ordered_json& messages() const { return messages_; }
  const std::string& text() const { return text_; }
  // The first token of what the template closes an assistant turn with, when it is a special token
  // (<|im_end|>, <|eot_id|>); -1 otherwise.
  int32_t end_of_turn_id() const { return end_of_turn_id_; }

 private:
  ChatFormat format_;
  nlohmann::ordered_json messages_;
  std::string text_;
  int32_t end_of_turn_id_ = -1;
};

}  // namespace troupe::actors
