// actors.chat_turns: multi-turn chat (rollout.template chat) on SmolLM2's, Llama 3.2's and Qwen3's
// official templates (tests/chat_template/templates): a conversation's context, built turn by turn
// from sampled tokens plus the appended turns, equals the tokenization of a full re-render of the
// whole conversation token for token (and the tokenization of transformers' rendering of it,
// tests/chat_template/references.json); where a template rewrites earlier turns the turn says so.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "troupe/actors/chat_turns.h"
#include "troupe/actors/roles.h"
#include "troupe/base/build_config.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The test BPE (tests/hf_fixture/tokenizer_qwen2: <|endoftext|>, <|im_start|>, <|im_end|>) plus the
// other families' special tokens as added tokens, so every template's markers are single ids as in
// the real vocabularies (Qwen3's <think>/<tool_call>... are added but not special, as in Qwen3's).
std::unique_ptr<policy::io::Tokenizer> family_tokenizer() {
  auto j = nlohmann::json::parse(read(fs::path(TROUPE_SOURCE_DIR) / "tests/hf_fixture/tokenizer_qwen2/tokenizer.json"));
  int id = 0;
  for (const auto& t : j["model"]["vocab"]) id = std::max(id, t.get<int>() + 1);
  for (const auto& t : j["added_tokens"]) id = std::max(id, t["id"].get<int>() + 1);
  auto add = [&](const std::string& content, bool special) {
    j["added_tokens"].push_back({{"id", id++}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", special}});
  };
  for (const char* s : {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})
    add(s, true);
  for (const char* s : {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"})
    add(s, false);
  const fs::path dir = fs::temp_directory_path() / ("troupe_chat_turns_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << j.dump();
  auto tok = policy::io::load_tokenizer_file((dir / "tokenizer.json").string());
  fs::remove_all(dir);
  EXPECT_TRUE(tok.ok()) << tok.error().message;
  return std::move(tok).value();
}

struct Family {
  std::string file, bos, eos;
};

const Family kSmolLM2{"HuggingFaceTB-SmolLM2-135M-Instruct.jinja", "<|im_start|>", "<|im_end|>"};
const Family kLlama32{"meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"};
const Family kQwen3{"Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>"};

struct Fixture {
  std::unique_ptr<policy::io::Tokenizer> tok;
  ChatFormat format;
};

Fixture setup(const Family& fam, ojson extra = ojson::object()) {
  Fixture s;
  s.tok = family_tokenizer();
  s.tok->set_special_ids(fam.bos.empty() ? -1 : s.tok->token_id(fam.bos), s.tok->token_id(fam.eos), -1);
  const std::string text = read(fs::path(TROUPE_SOURCE_DIR) / "tests/chat_template/templates" / fam.file);
  auto t = policy::io::ChatTemplate::parse(text, fam.file);
  EXPECT_TRUE(t.ok()) << t.error().message;
  auto f = make_chat_format(*s.tok, std::make_shared<const policy::io::ChatTemplate>(std::move(t).value()));
  EXPECT_TRUE(f.ok()) << f.error().message;
  s.format = std::move(f).value();
  s.format.options.extra = std::move(extra);
  s.format.options.extra["date_string"] = "03 Dec 2026";  // Llama 3.2: no strftime_now date in the header
  return s;
}

std::vector<int32_t> ids(const policy::io::Tokenizer& tok, const std::string& text) {
  auto r = tok.encode(text);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : std::vector<int32_t>{};
}

// One sampled turn and the env's answer to it.
struct Turn {
  std::string content;
  bool ends_with_eot = true;  // else: cut at max_response_length (no end-of-turn token)
  ojson feedback;
};

struct Episode {
  std::vector<int32_t> context;
  std::vector<int32_t> mask;  // over context after the prompt: 1 sampled, 0 appended
  ojson all;                  // every message, as a full re-render sees them
  int rerendered = 0, turns = 0;
};

// Runs the turns as the coordinator does: the prompt from the messages, then each turn's sampled
// tokens (the content's ids, then the end-of-turn token) and what add_turn appends.
Episode run(const Fixture& s, const ojson& messages, const std::vector<Turn>& turns) {
  Episode e;
  auto prompt = encode_chat_prompt(s.format, *s.tok, messages);
  EXPECT_TRUE(prompt.ok()) << prompt.error().message;
  e.context = *prompt;
  auto conv = ChatConversation::start(s.format, *s.tok, messages);
  EXPECT_TRUE(conv.ok()) << conv.error().message;
  e.all = messages;
  for (const auto& t : turns) {
    std::vector<int32_t> sampled = ids(*s.tok, t.content);
    EXPECT_GE(conv->end_of_turn_id(), 0);
    if (t.ends_with_eot) sampled.push_back(conv->end_of_turn_id());
    auto got = conv->add_turn(*s.tok, sampled, t.feedback);
    EXPECT_TRUE(got.ok()) << got.error().message;
    EXPECT_LE(got->kept, sampled.size());
    e.context.insert(e.context.end(), sampled.begin(), sampled.begin() + static_cast<std::ptrdiff_t>(got->kept));
    e.mask.insert(e.mask.end(), got->kept, 1);
    e.context.insert(e.context.end(), got->appended.begin(), got->appended.end());
    e.mask.insert(e.mask.end(), got->appended.size(), 0);
    e.all.push_back({{"role", "assistant"}, {"content", t.content}});
    for (const auto& m : t.feedback) e.all.push_back(m);
    e.rerendered += got->rerendered ? 1 : 0;
    ++e.turns;
    EXPECT_EQ(conv->messages(), e.all);
  }
  return e;
}

std::vector<int32_t> full_rerender(const Fixture& s, const ojson& all) {
  auto text = render_prompt(s.format, all);
  EXPECT_TRUE(text.ok()) << text.error().message;
  return ids(*s.tok, *text);
}

ojson user(const std::string& c) { return {{"role", "user"}, {"content", c}}; }
ojson tool(const std::string& c) { return {{"role", "tool"}, {"content", c}}; }

const ojson kFirst = ojson::array({{{"role", "system"}, {"content", "You are terse."}},
                                   user("Guess my number from 1 to 10, or call the calculator.")});

// Three turns: a user answer, a tool result, a user answer; the second sample is cut (no EOT).
std::vector<Turn> guess_turns() {
  return {{"5", true, ojson::array({user("higher")})},
          {"<tool_call>{\"name\": \"calculator\"}</tool_call>", false, ojson::array({tool("{\"result\": 12}")})},
          {"8", true, ojson::array({user("lower, 2 guesses left")})}};
}

void expect_full_rerender(const Family& fam) {
  Fixture s = setup(fam);
  ASSERT_GE(s.format.options.eos_token.is_string() ? 1 : 0, 1);
  Episode e = run(s, kFirst, guess_turns());
  EXPECT_EQ(e.rerendered, e.turns) << fam.file;
  EXPECT_EQ(e.context, full_rerender(s, e.all)) << fam.file;
  // the re-render is transformers' (tests/chat_template/references.json, made by make_references.py)
  bool golden = false;
  for (const auto& ref : ojson::parse(read(fs::path(TROUPE_SOURCE_DIR) / "tests/chat_template/references.json")))
    if (ref["template"] == fam.file && ref["messages"] == e.all && ref["add_generation_prompt"] == true) {
      EXPECT_EQ(ids(*s.tok, ref["expected"].get<std::string>()), e.context) << fam.file;
      golden = true;
    }
  EXPECT_TRUE(golden) << "no transformers reference of the conversation for " << fam.file;
  // the end-of-turn tokens that were sampled stay sampled (mask 1); the cut turn's is appended (mask 0)
  const int32_t eot = s.tok->token_id(fam.file == kLlama32.file ? "<|eot_id|>" : "<|im_end|>");
  auto prompt = encode_chat_prompt(s.format, *s.tok, kFirst);
  int sampled_eot = 0, appended_eot = 0;
  for (size_t i = 0; i < e.mask.size(); ++i)
    if (e.context[prompt->size() + i] == eot) (e.mask[i] ? sampled_eot : appended_eot) += 1;
  EXPECT_EQ(sampled_eot, 2) << fam.file;
  EXPECT_GE(appended_eot, 1) << fam.file;
}

TEST(ChatTurns, SmolLM2ContextIsTheFullRerender) { expect_full_rerender(kSmolLM2); }
TEST(ChatTurns, Llama32ContextIsTheFullRerender) { expect_full_rerender(kLlama32); }
TEST(ChatTurns, Qwen3ContextIsTheFullRerender) { expect_full_rerender(kQwen3); }

// Qwen3 renders earlier turns otherwise than they were sampled: without thinking, the generation
// prompt's empty <think></think> block is gone from earlier turns; with thinking, an earlier turn's
// reasoning is dropped. The context keeps what was sampled, the turn is flagged, and the appended
// tokens are still the template's turn (the closing, the answer, the generation prompt).
TEST(ChatTurns, Qwen3RewrittenTurnsAreFlaggedAndKeepTheSampledTokens) {
  for (bool thinking : {false, true}) {
    Fixture s = setup(kQwen3, ojson{{"enable_thinking", thinking}});
    std::vector<Turn> turns = {{thinking ? "<think>\nsmall\n</think>\n\n5" : "5", true, ojson::array({user("higher")})}};
    Episode e = run(s, kFirst, turns);
    EXPECT_EQ(e.rerendered, 0) << thinking;
    EXPECT_NE(e.context, full_rerender(s, e.all)) << thinking;
    auto prompt = encode_chat_prompt(s.format, *s.tok, kFirst);
    std::vector<int32_t> want = *prompt;
    auto sampled = ids(*s.tok, turns[0].content);
    want.insert(want.end(), sampled.begin(), sampled.end());
    auto tail = ids(*s.tok, std::string("<|im_end|>\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n") +
                                (thinking ? "" : "<think>\n\n</think>\n\n"));
    want.insert(want.end(), tail.begin(), tail.end());
    EXPECT_EQ(e.context, want) << thinking;
  }
}

// An EOS that is not the template's end of turn (Llama's <|end_of_text|>) is dropped, and the
// template's <|eot_id|> is appended (mask 0): the context is still the full re-render.
TEST(ChatTurns, AnotherEosIsReplacedByTheTemplatesEndOfTurn) {
  Fixture s = setup(kLlama32);
  s.tok->set_special_ids(s.tok->token_id("<|begin_of_text|>"), s.tok->token_id("<|end_of_text|>"), -1);
  auto conv = ChatConversation::start(s.format, *s.tok, kFirst);
  ASSERT_TRUE(conv.ok());
  std::vector<int32_t> sampled = ids(*s.tok, "5");
  sampled.push_back(s.tok->eos_id());
  auto t = conv->add_turn(*s.tok, sampled, ojson::array({user("higher")}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->kept, sampled.size() - 1);
  EXPECT_TRUE(t->rerendered);
  ASSERT_FALSE(t->appended.empty());
  EXPECT_EQ(t->appended[0], s.tok->token_id("<|eot_id|>"));
  std::vector<int32_t> ctx = *encode_chat_prompt(s.format, *s.tok, kFirst);
  ctx.insert(ctx.end(), sampled.begin(), sampled.end() - 1);
  ctx.insert(ctx.end(), t->appended.begin(), t->appended.end());
  ojson all = kFirst;
  all.push_back({{"role", "assistant"}, {"content", "5"}});
  all.push_back(user("higher"));
  EXPECT_EQ(ctx, full_rerender(s, all));
}

// A model without a chat template: the built-in tags after BOS. The first prompt equals the plain
// format_prompt's chat text; a turn appends "\n<|user|>\n" + answer + "\n<|assistant|>\n", EOS dropped.
TEST(ChatTurns, BuiltinTagsWithoutAModelTemplate) {
  auto tok = make_builtin_tokenizer("byte");
  ASSERT_TRUE(tok.ok());
  RolloutSection r;
  r.template_name = PromptTemplate::chat;
  r.system_prompt = "Guess.";
  auto f = make_chat_format(**tok, nullptr);
  ASSERT_TRUE(f.ok());
  auto messages = first_messages(r.system_prompt, "1 to 10?", "");
  ASSERT_TRUE(messages.ok());
  auto by_messages = encode_chat_prompt(*f, **tok, *messages);
  auto by_text = encode_prompt(r, **tok, nullptr, "1 to 10?");
  ASSERT_TRUE(by_messages.ok() && by_text.ok());
  EXPECT_EQ(*by_messages, *by_text);
  auto conv = ChatConversation::start(*f, **tok, *messages);
  ASSERT_TRUE(conv.ok());
  EXPECT_EQ(conv->end_of_turn_id(), -1);  // "\n" closes a turn: not a special token
  std::vector<int32_t> sampled = *(*tok)->encode("5");
  sampled.push_back((*tok)->eos_id());
  auto t = conv->add_turn(**tok, sampled, ojson::array({user("higher")}));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->kept, 1u);
  EXPECT_TRUE(t->rerendered);
  EXPECT_EQ(t->appended, *(*tok)->encode("\n<|user|>\nhigher\n<|assistant|>\n"));
}

// The env's messages become the prompt (a system prompt and a few-shot turn), rollout.system_prompt
// only when they have no system message; a step's answer is its messages, else its text as a `tool`
// turn when its info lists tool calls, else as a `user` turn. Malformed messages are errors.
TEST(ChatTurns, MessagesBecomeThePromptAndTheAnswers) {
  const std::string shots =
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"},)"
      R"( {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2?"}])";
  auto m = first_messages("Ignored.", "2+2?", shots);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size(), 4u);
  EXPECT_EQ((*m)[0]["content"], "Be brief.");
  auto no_system = first_messages("Sys.", "x", R"([{"role": "user", "content": "x"}])");
  ASSERT_TRUE(no_system.ok());
  EXPECT_EQ(*no_system, ojson::parse(R"([{"role": "system", "content": "Sys."}, {"role": "user", "content": "x"}])"));
  EXPECT_EQ(*first_messages("", "only text", "[]"), ojson::array({user("only text")}));
  auto bad = first_messages("", "x", R"([{"content": "no role"}])");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("role"), std::string::npos);
  EXPECT_FALSE(first_messages("", "x", R"({"role": "user"})").ok());

  EXPECT_EQ(*feedback_messages("12", "[]", R"({"tool_calls": []})"), ojson::array({tool("12")}));
  EXPECT_EQ(*feedback_messages("higher", "", "{}"), ojson::array({user("higher")}));
  EXPECT_EQ(*feedback_messages("t", R"([{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}])", "{}"),
            ojson::array({tool("a"), tool("b")}));

  // SmolLM2: the few-shot conversation is the prompt, rendered by the template
  Fixture s = setup(kSmolLM2);
  RolloutSection r;
  r.template_name = PromptTemplate::chat;
  auto via_roles = encode_prompt(r, *s.tok, s.format.tmpl.get(), "2+2?", shots);
  ASSERT_TRUE(via_roles.ok()) << via_roles.error().message;
  EXPECT_EQ(*via_roles, ids(*s.tok, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n"
                                    "<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                                    "<|im_start|>assistant\n"));
  r.template_name = PromptTemplate::plain;  // plain: the text, messages ignored
  auto plain = encode_prompt(r, *s.tok, s.format.tmpl.get(), "2+2?", shots);
  ASSERT_TRUE(plain.ok());
  std::vector<int32_t> want_plain = {s.tok->bos_id()};
  for (int32_t id : ids(*s.tok, "2+2?")) want_plain.push_back(id);
  EXPECT_EQ(*plain, want_plain);
}

// A template that never writes an assistant's content cannot carry a multi-turn chat: an error
// naming the template.
TEST(ChatTurns, TemplateWithoutAssistantContentIsAnError) {
  auto tok = make_builtin_tokenizer("byte");
  auto t = policy::io::ChatTemplate::parse("{% for m in messages %}{{ m.role }}{% endfor %}", "odd.jinja");
  ASSERT_TRUE(t.ok());
  auto f = make_chat_format(**tok, std::make_shared<const policy::io::ChatTemplate>(std::move(t).value()));
  ASSERT_TRUE(f.ok());
  auto c = ChatConversation::start(*f, **tok, ojson::array({user("x")}));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("odd.jinja"), std::string::npos);
}

}  // namespace
}  // namespace troupe::actors
