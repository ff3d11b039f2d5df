// policy.tokenizer: troupe's byte/char tokenizers round-trip and save/load; the Hugging Face BPE
// loader reproduces the ids the `tokenizers` package produced (tests/hf_fixture/tokenizer_*/expected.json).
#include "troupe/policy/io/tokenizer.h"

#include <gtest/gtest.h>

#include "test_temp_dir.h"

#include <filesystem>
#include <set>
#include <fstream>
#include <nlohmann/json.hpp>

#include "troupe/base/build_config.h"

namespace fs = std::filesystem;
using namespace troupe::policy::io;
using nlohmann::json;

namespace {

fs::path temp_dir(const std::string& name) { return troupe::policy::io::testing::make_temp_dir("tok", name); }

fs::path fixture(const std::string& sub) { return fs::path(TROUPE_SOURCE_DIR) / "tests" / "hf_fixture" / sub; }

}  // namespace

TEST(ByteTokenizer, RoundTripAndSpecials) {
  auto t = make_char_tokenizer({});
  ASSERT_TRUE(t.ok()) << t.error().message;
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.kind(), "byte");
  EXPECT_EQ(tok.vocab_size(), 3 + 256);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  const std::string text = "2+3=5 Café 🙂";
  auto ids = tok.encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), text.size());
  EXPECT_EQ((*ids)[0], 3 + '2');
  EXPECT_EQ(*tok.decode(*ids), text);
  auto with_eos = tok.encode("ab<eos>");
  EXPECT_EQ(*with_eos, (std::vector<int32_t>{3 + 'a', 3 + 'b', 2}));
  EXPECT_EQ(*tok.decode(*with_eos), "ab<eos>");
  EXPECT_EQ(*tok.decode(*with_eos, true), "ab");
  auto bad = tok.decode({259});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("259"), std::string::npos);
}

TEST(CharTokenizer, EncodesCharsAndUnknowns) {
  CharTokenizerSpec s;
  s.kind = "char";
  s.special_tokens = {"<pad>", "<bos>", "<eos>", "<unk>"};
  s.unk = "<unk>";
  s.chars = "0123456789+-=é";
  auto t = make_char_tokenizer(s);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ((*t)->vocab_size(), 4 + 14);
  auto ids = (*t)->encode("12+é?");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{5, 6, 14, 17, 3}));
  EXPECT_EQ(*(*t)->decode(*ids), "12+é<unk>");
  s.unk.clear();
  auto strict = make_char_tokenizer(s);
  auto e = (*strict)->encode("1?");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("\"?\""), std::string::npos);
}

TEST(CharTokenizer, SaveLoadAndBadFiles) {
  auto d = temp_dir("save");
  CharTokenizerSpec s;
  s.kind = "char";
  s.chars = "abc";
  auto t = make_char_tokenizer(s);
  ASSERT_TRUE((*t)->save(d.string()).ok());
  auto back = load_tokenizer_dir(d.string());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ((*back)->kind(), "char");
  EXPECT_EQ(*(*back)->encode("cab"), *(*t)->encode("cab"));
  EXPECT_EQ((*back)->eos_id(), 2);

  const auto file = (d / kTroupeTokenizerFile).string();
  std::ofstream(file) << R"({"troupe_tokenizer": 1, "kind": "wordpiece"})";
  auto k = load_tokenizer_dir(d.string());
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.error().message.find("wordpiece"), std::string::npos);
  EXPECT_NE(k.error().message.find(file), std::string::npos);
  std::ofstream(file) << R"({"troupe_tokenizer": 1, "kind": "byte", "eos": "<end>"})";
  auto m = load_tokenizer_dir(d.string());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("<end>"), std::string::npos);
  std::ofstream(file) << "{oops";
  auto j = load_tokenizer_dir(d.string());
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.error().message.find("not valid JSON"), std::string::npos);
  fs::remove(file);
  auto none = load_tokenizer_dir(d.string());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("missing tokenizer"), std::string::npos);
}

TEST(Gpt2ByteMap, IsABijectionOntoPrintables) {
  const auto& m = gpt2_byte_to_codepoint();
  EXPECT_EQ(m['A'], static_cast<uint32_t>('A'));
  EXPECT_EQ(m[' '], 0x120u);  // 'Ġ'
  EXPECT_EQ(m['\n'], 0x10au);  // 'Ċ'
  std::set<uint32_t> seen(m.begin(), m.end());
  EXPECT_EQ(seen.size(), 256u);
}

class HfBpe : public ::testing::TestWithParam<std::string> {};

TEST_P(HfBpe, MatchesTokenizersPackage) {
  const fs::path dir = fixture(GetParam());
  auto t = load_tokenizer_dir(dir.string());
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ((*t)->kind(), "bpe");
  std::ifstream in(dir / "expected.json");
  ASSERT_TRUE(in) << dir;
  json e = json::parse(in);
  int n = 0;
  for (const auto& c : e["cases"]) {
    const std::string text = c["text"];
    auto ids = (*t)->encode(text);
    ASSERT_TRUE(ids.ok()) << ids.error().message;
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << "text: " << json(text).dump();
    auto dec = (*t)->decode(c["ids"].get<std::vector<int32_t>>());
    ASSERT_TRUE(dec.ok());
    EXPECT_EQ(*dec, c["decoded"].get<std::string>());
    ++n;
  }
  EXPECT_GE(n, 10);
  EXPECT_EQ((*t)->token_id("<|im_end|>"), 2);
  // Saving writes the file back so a model directory keeps its tokenizer.
  auto d = temp_dir("bpe_" + GetParam());
  ASSERT_TRUE((*t)->save(d.string()).ok());
  auto again = load_tokenizer_dir(d.string());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*(*again)->encode("Hello world"), *(*t)->encode("Hello world"));
  auto bad = (*t)->encode(std::string("\xff\xfe", 2));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("UTF-8"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfBpe, ::testing::Values("tokenizer_gpt2", "tokenizer_qwen2"));

TEST(HfBpeErrors, UnsupportedFilesAreErrors) {
  auto d = temp_dir("hfbad");
  const auto file = (d / kHfTokenizerFile).string();
  std::ofstream(file) << R"({"model": {"type": "Unigram", "vocab": []}})";
  auto u = load_tokenizer_dir(d.string());
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.error().message.find("Unigram"), std::string::npos);
  EXPECT_NE(u.error().message.find(file), std::string::npos);
  std::ofstream(file) << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})";
  auto r = load_tokenizer_dir(d.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("regex"), std::string::npos);
  std::ofstream(file) << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": null})";
  auto nb = load_tokenizer_dir(d.string());
  ASSERT_FALSE(nb.ok());
  EXPECT_NE(nb.error().message.find("ByteLevel"), std::string::npos);
}
