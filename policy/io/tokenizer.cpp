// Tokenizers: troupe's char/byte tokenizer and Hugging Face BPE (tokenizer.json), byte-level or
// SentencePiece-style. BPE follows the tokenizers library: added tokens are cut out first, the
// pre-tokenizer regex (PCRE2, the file's own pattern) splits the rest, bytes map through GPT-2's
// table, merges by rank. SentencePiece-style (byte_fallback, Metaspace): spaces become U+2581, a
// prefix one is added, merges run on code points, pieces outside the vocabulary become <0xXX> bytes.
#include "troupe/policy/io/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <unordered_map>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace troupe::policy::io {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A tokenizer's save(): j, indented by 2, as dir/file.
Status save_json(const std::string& dir, const char* file, const json& j) {
  const std::string path = (fs::path(dir) / file).string();
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) return make_error(ErrorCode::io, path + ": write failed");
  return {};
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    s.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    s.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// Decodes one UTF-8 code point at s[i]; returns its length, 0 if the bytes are not valid UTF-8.
size_t utf8_next(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  cp = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 2) return 0;
    cp = (cp << 6) | (c & 0x3f);
  }
  return n;
}

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t n = utf8_next(s, i, cp);
    if (n == 0) n = 1;  // callers validate first; keep going rather than loop forever
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// A piece of input text: either a literal added/special token (id >= 0) or text to tokenize.
struct Segment {
  std::string_view text;
  int32_t id = -1;
};

// Splits text at occurrences of `tokens` (longest match first at each position).
std::vector<Segment> split_added(std::string_view text, const std::vector<std::pair<std::string, int32_t>>& tokens) {
  std::vector<Segment> out;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    bool hit = false;
    for (const auto& [tok, id] : tokens) {  // sorted by length, longest first
      if (!tok.empty() && text.compare(i, tok.size(), tok) == 0) {
        if (i > start) out.push_back({text.substr(start, i - start), -1});
        out.push_back({text.substr(i, tok.size()), id});
        i += tok.size();
        start = i;
        hit = true;
        break;
      }
    }
    if (!hit) ++i;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1});
  return out;
}

// ---- troupe's char / byte tokenizer ----

class CharTokenizer final : public Tokenizer {
 public:
  explicit CharTokenizer(CharTokenizerSpec spec) : spec_(std::move(spec)) {}

  Status init() {
    for (size_t i = 0; i < spec_.special_tokens.size(); ++i) {
      const auto& t = spec_.special_tokens[i];
      if (t.empty()) return invalid_input("special token " + std::to_string(i) + " is empty");
      if (special_ids_.count(t)) return invalid_input("special token \"" + t + "\" is listed twice");
      special_ids_[t] = static_cast<int32_t>(i);
      by_length_.emplace_back(t, static_cast<int32_t>(i));
    }
    std::sort(by_length_.begin(), by_length_.end(), [](auto& a, auto& b) { return a.first.size() > b.first.size(); });
    auto id_of = [&](const std::string& name, const char* role) -> Result<int32_t> {
      if (name.empty()) return -1;
      auto it = special_ids_.find(name);
      if (it == special_ids_.end())
        return invalid_input(std::string(role) + " token \"" + name + "\" is not among special_tokens");
      return it->second;
    };
    TROUPE_ASSIGN_OR_RETURN(bos_, id_of(spec_.bos, "bos"));
    TROUPE_ASSIGN_OR_RETURN(eos_, id_of(spec_.eos, "eos"));
    TROUPE_ASSIGN_OR_RETURN(pad_, id_of(spec_.pad, "pad"));
    TROUPE_ASSIGN_OR_RETURN(unk_, id_of(spec_.unk, "unk"));
    const int32_t base = static_cast<int32_t>(spec_.special_tokens.size());
    if (spec_.kind == "byte") {
      vocab_ = base + 256;
    } else if (spec_.kind == "char") {
      for (size_t i = 0; i < spec_.chars.size();) {
        uint32_t cp;
        const size_t n = utf8_next(spec_.chars, i, cp);
        if (n == 0) return invalid_input("chars is not valid UTF-8 (byte " + std::to_string(i) + ")");
        std::string ch = spec_.chars.substr(i, n);
        if (char_ids_.count(ch)) return invalid_input("chars lists \"" + ch + "\" twice");
        char_ids_[ch] = static_cast<int32_t>(base + id_chars_.size());
        id_chars_.push_back(ch);
        i += n;
      }
      vocab_ = base + static_cast<int>(id_chars_.size());
    } else {
      return invalid_input("kind \"" + spec_.kind + "\" is not a troupe tokenizer kind (use \"byte\" or \"char\")");
    }
    return {};
  }

  std::string kind() const override { return spec_.kind; }
  int vocab_size() const override { return vocab_; }

  int32_t token_id(std::string_view token) const override {
    auto it = special_ids_.find(std::string(token));
    if (it != special_ids_.end()) return it->second;
    const int32_t base = static_cast<int32_t>(spec_.special_tokens.size());
    if (spec_.kind == "byte") return token.size() == 1 ? base + static_cast<unsigned char>(token[0]) : -1;
    auto c = char_ids_.find(std::string(token));
    return c == char_ids_.end() ? -1 : c->second;
  }

  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    const int32_t base = static_cast<int32_t>(spec_.special_tokens.size());
    for (const Segment& seg : split_added(text, by_length_)) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
        continue;
      }
      if (spec_.kind == "byte") {
        for (char ch : seg.text) ids.push_back(base + static_cast<unsigned char>(ch));
        continue;
      }
      for (size_t i = 0; i < seg.text.size();) {
        uint32_t cp;
        size_t n = utf8_next(seg.text, i, cp);
        if (n == 0) n = 1;
        auto it = char_ids_.find(std::string(seg.text.substr(i, n)));
        if (it != char_ids_.end()) {
          ids.push_back(it->second);
        } else if (unk_ >= 0) {
          ids.push_back(unk_);
        } else {
          return invalid_input("character \"" + std::string(seg.text.substr(i, n)) +
                               "\" is not in the tokenizer's chars and it has no unk token");
        }
        i += n;
      }
    }
    return ids;
  }

  Result<std::string> decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string s;
    const int32_t base = static_cast<int32_t>(spec_.special_tokens.size());
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_)
        return invalid_input("token id " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(vocab_ - 1) + ")");
      if (id < base) {
        if (!skip_special) s += spec_.special_tokens[static_cast<size_t>(id)];
      } else if (spec_.kind == "byte") {
        s.push_back(static_cast<char>(id - base));
      } else {
        s += id_chars_[static_cast<size_t>(id - base)];
      }
    }
    return s;
  }

  Status save(const std::string& dir) const override {
    json j = {{"troupe_tokenizer", 1}, {"kind", spec_.kind}, {"special_tokens", spec_.special_tokens},
              {"pad", spec_.pad}, {"bos", spec_.bos}, {"eos", spec_.eos}, {"unk", spec_.unk}};
    if (spec_.kind == "char") j["chars"] = spec_.chars;
    return save_json(dir, kTroupeTokenizerFile, j);
  }

 private:
  CharTokenizerSpec spec_;
  std::map<std::string, int32_t> special_ids_;
  std::vector<std::pair<std::string, int32_t>> by_length_;
  std::unordered_map<std::string, int32_t> char_ids_;
  std::vector<std::string> id_chars_;
  int32_t unk_ = -1;
  int vocab_ = 0;
};

// ---- Hugging Face byte-level BPE ----

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A compiled pre-tokenizer regex; Isolated keeps matches and gaps, Removed drops the matches.
class SplitRegex {
 public:
  static Result<std::shared_ptr<SplitRegex>> compile(const std::string& pattern, bool removed, const std::string& file) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return invalid_input(file + ": pre-tokenizer regex does not compile at offset " + std::to_string(off) + ": " +
                           reinterpret_cast<char*>(msg) + " (pattern " + pattern + ")");
    }
    auto r = std::make_shared<SplitRegex>();
    r->code_ = code;
    r->removed_ = removed;
    return r;
  }
  SplitRegex() = default;
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;
  ~SplitRegex() {
    if (code_) pcre2_code_free(code_);
  }

  // Splits each input piece; text must be valid UTF-8.
  std::vector<std::string_view> split(std::string_view s) const {
    std::vector<std::string_view> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0, last = 0;
    while (pos <= s.size()) {
      int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, 0, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: step one code point
        if (b >= s.size()) break;
        uint32_t cp;
        size_t n = utf8_next(s, b, cp);
        pos = b + (n ? n : 1);
        continue;
      }
      if (b > last) out.push_back(s.substr(last, b - last));
      if (!removed_) out.push_back(s.substr(b, e - b));
      last = pos = e;
    }
    if (last < s.size()) out.push_back(s.substr(last));
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
  bool removed_ = false;
};

class BpeTokenizer final : public Tokenizer {
 public:
  Status init(json j, const std::string& file) {
    file_ = file;
    const json& m = j["model"];
    if (!m.is_object()) return invalid_input(file + ": missing \"model\" object");
    const std::string type = m.value("type", "");
    if (type != "BPE") return invalid_input(file + ": model.type \"" + type + "\" is not supported (troupe loads byte-level BPE)");
    if (!m.contains("vocab") || !m["vocab"].is_object()) return invalid_input(file + ": model.vocab must be an object");
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      if (!it.value().is_number_integer()) return invalid_input(file + ": model.vocab[\"" + it.key() + "\"] is not an integer id");
      add_token(it.key(), it.value().get<int32_t>());
    }
    if (m.contains("merges") && m["merges"].is_array()) {
      int rank = 0;
      for (const auto& mg : m["merges"]) {
        std::string a, b;
        if (mg.is_string()) {
          const std::string s = mg.get<std::string>();
          const size_t sp = s.find(' ', 1);
          if (sp == std::string::npos) return invalid_input(file + ": merge \"" + s + "\" has no space");
          a = s.substr(0, sp), b = s.substr(sp + 1);
        } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
          a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
        } else {
          return invalid_input(file + ": merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
        }
        ranks_.emplace(a + '\x01' + b, rank++);
      }
    }
    ignore_merges_ = m.value("ignore_merges", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) unk_ = token_id(m["unk_token"].get<std::string>());
    byte_fallback_ = m.value("byte_fallback", false);
    fuse_unk_ = m.value("fuse_unk", false);

    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const auto& t : j["added_tokens"]) {
        if (!t.contains("content") || !t.contains("id")) return invalid_input(file + ": an added_tokens entry lacks content or id");
        const std::string content = t["content"].get<std::string>();
        const int32_t id = t["id"].get<int32_t>();
        add_token(content, id);
        added_.emplace_back(content, id);
        if (t.value("special", false)) special_.insert(id);
      }
      std::sort(added_.begin(), added_.end(), [](auto& a, auto& b) { return a.first.size() > b.first.size(); });
    }

    const json& norm = j.contains("normalizer") ? j["normalizer"] : json();
    if (is_legacy_metaspace_normalizer(norm)) {  // Sequence[Prepend("▁"), Replace(" ", "▁")]
      metaspace_ = true, prepend_ = Prepend::always;
    } else if (!norm.is_null()) {
      // NFC is accepted: text troupe tokenizes is NFC already in practice (ASCII always is).
      const std::string nt = norm.value("type", "");
      if (nt != "NFC") return invalid_input(file + ": normalizer \"" + nt + "\" is not supported (only none or NFC)");
    }
    const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
    TROUPE_TRY(add_pre_tokenizer(pre));
    if (byte_level_ == metaspace_)
      return invalid_input(file + ": pre_tokenizer/normalizer must have exactly one of ByteLevel (byte-level BPE) and Metaspace "
                                  "(SentencePiece-style BPE)");
    if (metaspace_ && !byte_fallback_)
      return invalid_input(file + ": Metaspace BPE without byte_fallback is not supported");
    if (byte_level_ && byte_fallback_) return invalid_input(file + ": byte_fallback with ByteLevel is not supported");
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(s, gpt2_byte_to_codepoint()[static_cast<size_t>(b)]);
      byte_str_[static_cast<size_t>(b)] = s;
      cp_byte_[gpt2_byte_to_codepoint()[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
    }
    json_ = std::move(j);
    return {};
  }

  std::string kind() const override { return "bpe"; }
  int vocab_size() const override { return static_cast<int>(id_tok_.size()); }
  int32_t token_id(std::string_view token) const override {
    auto it = tok_id_.find(std::string(token));
    return it == tok_id_.end() ? -1 : it->second;
  }

  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    for (size_t i = 0; i < text.size();) {
      uint32_t cp;
      const size_t n = utf8_next(text, i, cp);
      if (n == 0) return invalid_input("text is not valid UTF-8 at byte " + std::to_string(i));
      i += n;
    }
    std::vector<int32_t> ids;
    for (const Segment& seg : split_added(text, added_)) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
        continue;
      }
      if (metaspace_) {
        TROUPE_TRY(metaspace_piece(seg.text, seg.text.data() == text.data(), ids));
        continue;
      }
      std::string first;
      std::string_view whole = seg.text;
      if (add_prefix_space_ && !whole.empty() && whole[0] != ' ') {
        first.assign(1, ' ');
        first.append(whole.data(), whole.size());
        whole = first;
      }
      std::vector<std::string_view> pieces = {whole};
      for (const auto& rx : splits_) {
        std::vector<std::string_view> next;
        for (auto p : pieces)
          for (auto q : rx->split(p)) next.push_back(q);
        pieces = std::move(next);
      }
      for (auto p : pieces) TROUPE_TRY(bpe_piece(p, ids));
    }
    return ids;
  }

  Result<std::string> decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    if (metaspace_) return metaspace_decode(ids, skip_special);
    std::string s;
    for (int32_t id : ids) {
      if (id < 0 || id >= static_cast<int32_t>(id_tok_.size()) || !has_id_[static_cast<size_t>(id)])
        return invalid_input("token id " + std::to_string(id) + " is not in the vocabulary of " + file_);
      if (special_.count(id)) {
        if (!skip_special) s += id_tok_[static_cast<size_t>(id)];
        continue;
      }
      const std::string& t = id_tok_[static_cast<size_t>(id)];
      bool added = std::any_of(added_.begin(), added_.end(), [&](auto& a) { return a.second == id; });
      if (added) {
        s += t;
        continue;
      }
      for (size_t i = 0; i < t.size();) {  // ByteLevel decoder: code points back to bytes
        uint32_t cp;
        size_t n = utf8_next(t, i, cp);
        if (n == 0) n = 1, cp = static_cast<unsigned char>(t[i]);
        auto b = cp_byte_.find(cp);
        if (b != cp_byte_.end()) s.push_back(static_cast<char>(b->second));
        else s += t.substr(i, n);
        i += n;
      }
    }
    return s;
  }

  Status save(const std::string& dir) const override { return save_json(dir, kHfTokenizerFile, json_); }

 private:
  void add_token(const std::string& t, int32_t id) {
    if (id < 0) return;
    if (static_cast<size_t>(id) >= id_tok_.size()) id_tok_.resize(static_cast<size_t>(id) + 1), has_id_.resize(id_tok_.size());
    id_tok_[static_cast<size_t>(id)] = t;
    has_id_[static_cast<size_t>(id)] = true;
    tok_id_[t] = id;
  }

  Status add_pre_tokenizer(const json& p) {
    if (p.is_null()) return {};
    const std::string type = p.value("type", "");
    if (type == "Sequence") {
      for (const auto& q : p["pretokenizers"]) TROUPE_TRY(add_pre_tokenizer(q));
      return {};
    }
    if (type == "ByteLevel") {
      byte_level_ = true;
      add_prefix_space_ = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) {
        TROUPE_ASSIGN_OR_RETURN(auto rx, SplitRegex::compile(kGpt2Pattern, false, file_));
        splits_.push_back(rx);
      }
      return {};
    }
    if (type == "Split") {
      std::string pattern;
      const json& pat = p["pattern"];
      if (pat.contains("Regex")) {
        pattern = pat["Regex"].get<std::string>();
      } else if (pat.contains("String")) {  // a literal: quote it for PCRE2
        pattern = "\\Q" + pat["String"].get<std::string>() + "\\E";
      } else {
        return invalid_input(file_ + ": Split pre-tokenizer needs pattern.Regex or pattern.String");
      }
      const std::string behavior = p.value("behavior", "Isolated");
      if (behavior != "Isolated" && behavior != "Removed")
        return invalid_input(file_ + ": Split behavior \"" + behavior + "\" is not supported (Isolated, Removed)");
      if (p.value("invert", false)) return invalid_input(file_ + ": Split with invert true is not supported");
      TROUPE_ASSIGN_OR_RETURN(auto rx, SplitRegex::compile(pattern, behavior == "Removed", file_));
      splits_.push_back(rx);
      return {};
    }
    if (type == "Metaspace") {
      if (p.value("replacement", std::string(kMeta)) != kMeta)
        return invalid_input(file_ + ": Metaspace replacement other than U+2581 is not supported");
      if (p.value("split", false)) return invalid_input(file_ + ": Metaspace with split true is not supported");
      metaspace_ = true;
      std::string scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
      if (scheme == "always") prepend_ = Prepend::always;
      else if (scheme == "first") prepend_ = Prepend::first;
      else if (scheme == "never") prepend_ = Prepend::never;
      else return invalid_input(file_ + ": Metaspace prepend_scheme \"" + scheme + "\" is not supported (always, first, never)");
      return {};
    }
    return invalid_input(file_ + ": pre_tokenizer \"" + type + "\" is not supported (ByteLevel, Split, Metaspace, Sequence)");
  }

  static constexpr const char* kMeta = "\u2581";

  static bool is_legacy_metaspace_normalizer(const json& n) {
    if (!n.is_object() || n.value("type", "") != "Sequence" || !n.contains("normalizers") || n["normalizers"].size() != 2) return false;
    const json& a = n["normalizers"][0];
    const json& b = n["normalizers"][1];
    return a.value("type", "") == "Prepend" && a.value("prepend", "") == kMeta && b.value("type", "") == "Replace" &&
           b.contains("pattern") && b["pattern"].value("String", "") == " " && b.value("content", "") == kMeta;
  }

  // SentencePiece-style: spaces -> U+2581, the prefix one (prepend_scheme), merges on code points.
  Status metaspace_piece(std::string_view seg, bool at_start, std::vector<int32_t>& ids) const {
    std::string t;
    for (char c : seg) {
      if (c == ' ') t += kMeta;
      else t.push_back(c);
    }
    const bool prepend = prepend_ == Prepend::always || (prepend_ == Prepend::first && at_start);
    if (prepend && t.compare(0, 3, kMeta) != 0) t.insert(0, kMeta);
    return bpe_piece(t, ids);
  }

  Result<std::string> metaspace_decode(const std::vector<int32_t>& ids, bool skip_special) const {
    std::string s;
    for (int32_t id : ids) {
      if (id < 0 || id >= static_cast<int32_t>(id_tok_.size()) || !has_id_[static_cast<size_t>(id)])
        return invalid_input("token id " + std::to_string(id) + " is not in the vocabulary of " + file_);
      if (special_.count(id) && skip_special) continue;
      const std::string& t = id_tok_[static_cast<size_t>(id)];
      unsigned byte = 0;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::sscanf(t.c_str() + 3, "%2x", &byte) == 1) {
        s.push_back(static_cast<char>(byte));  // ByteFallback
        continue;
      }
      for (size_t i = 0; i < t.size();) {  // Replace U+2581 -> space
        if (t.compare(i, 3, kMeta) == 0) s.push_back(' '), i += 3;
        else s.push_back(t[i++]);
      }
    }
    if (prepend_ != Prepend::never && !s.empty() && s[0] == ' ') s.erase(0, 1);  // Strip(left=1)
    return s;
  }

  // Byte-level BPE of one pre-token: bytes -> GPT-2 code points, merge the lowest-ranked pair until none.
  Status bpe_piece(std::string_view piece, std::vector<int32_t>& ids) const {
    if (piece.empty()) return {};
    std::string mapped;
    if (metaspace_) mapped.assign(piece);
    else for (char c : piece) mapped += byte_str_[static_cast<unsigned char>(c)];
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      auto it = cache_.find(mapped);
      if (it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return {};
      }
    }
    std::vector<int32_t> out;
    auto direct = tok_id_.find(mapped);
    if (ignore_merges_ && direct != tok_id_.end()) {
      out.push_back(direct->second);
    } else {
      std::vector<std::string> sym = utf8_chars(mapped);
      while (sym.size() > 1) {
        int best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
          auto r = ranks_.find(sym[i] + '\x01' + sym[i + 1]);
          if (r != ranks_.end() && (best < 0 || r->second < best)) best = r->second, at = i;
        }
        if (best < 0) break;
        const std::string a = sym[at], b = sym[at + 1];
        std::vector<std::string> next;
        for (size_t i = 0; i < sym.size(); ++i) {
          if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
            next.push_back(a + b);
            ++i;
          } else {
            next.push_back(sym[i]);
          }
        }
        sym = std::move(next);
      }
      for (const auto& s : sym) {
        auto it = tok_id_.find(s);
        if (it != tok_id_.end()) {
          out.push_back(it->second);
        } else if (byte_fallback_ && byte_tokens(s, out)) {
        } else if (unk_ >= 0) {
          if (!(fuse_unk_ && !out.empty() && out.back() == unk_)) out.push_back(unk_);
        } else {
          return invalid_input(file_ + ": BPE produced \"" + s + "\", which is not in the vocabulary (and there is no unk_token)");
        }
      }
    }
    ids.insert(ids.end(), out.begin(), out.end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() < 100000) cache_.emplace(std::move(mapped), std::move(out));
    return {};
  }

  // <0xXX> ids of each byte of s, appended to out when all exist.
  bool byte_tokens(const std::string& s, std::vector<int32_t>& out) const {
    std::vector<int32_t> b;
    for (unsigned char c : s) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", c);
      auto it = tok_id_.find(name);
      if (it == tok_id_.end()) return false;
      b.push_back(it->second);
    }
    out.insert(out.end(), b.begin(), b.end());
    return true;
  }

  enum class Prepend { always, first, never };
  bool metaspace_ = false, byte_fallback_ = false, fuse_unk_ = false;
  Prepend prepend_ = Prepend::always;
  std::string file_;
  json json_;
  std::unordered_map<std::string, int32_t> tok_id_;
  std::vector<std::string> id_tok_;
  std::vector<bool> has_id_;
  std::unordered_map<std::string, int> ranks_;  // "a\x01b" -> merge rank
  std::vector<std::pair<std::string, int32_t>> added_;  // longest first
  std::set<int32_t> special_;
  std::vector<std::shared_ptr<SplitRegex>> splits_;
  bool byte_level_ = false, add_prefix_space_ = false, ignore_merges_ = false;
  int32_t unk_ = -1;
  std::string byte_str_[256];
  std::unordered_map<uint32_t, uint8_t> cp_byte_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

int32_t special_from_config(const json& j, const char* key, const Tokenizer& t) {
  if (!j.contains(key)) return -1;
  const json& v = j[key];
  std::string s;
  if (v.is_string()) s = v.get<std::string>();
  else if (v.is_object() && v.contains("content") && v["content"].is_string()) s = v["content"].get<std::string>();
  else return -1;
  return t.token_id(s);
}

}  // namespace

const std::vector<uint32_t>& gpt2_byte_to_codepoint() {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256);
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      t[b] = printable ? b : 256 + extra++;
    }
    return t;
  }();
  return table;
}

Result<std::unique_ptr<Tokenizer>> make_char_tokenizer(const CharTokenizerSpec& spec) {
  auto t = std::make_unique<CharTokenizer>(spec);
  TROUPE_TRY(t->init());
  return std::unique_ptr<Tokenizer>(std::move(t));
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_input(path + ": cannot open tokenizer file");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    return invalid_input(path + ": tokenizer file is not valid JSON: " + e.what());
  }
  if (!j.is_object()) return invalid_input(path + ": tokenizer file must be a JSON object");
  if (j.contains("troupe_tokenizer")) {
    CharTokenizerSpec s;
    try {
      s.kind = j.value("kind", s.kind);
      if (j.contains("special_tokens")) s.special_tokens = j["special_tokens"].get<std::vector<std::string>>();
      s.pad = j.value("pad", std::string());
      s.bos = j.value("bos", std::string());
      s.eos = j.value("eos", std::string());
      s.unk = j.value("unk", std::string());
      s.chars = j.value("chars", std::string());
    } catch (const json::exception& e) {
      return invalid_input(path + ": bad troupe tokenizer file: " + e.what());
    }
    auto t = make_char_tokenizer(s);
    if (!t.ok()) return invalid_input(path + ": " + t.error().message);
    return t;
  }
  if (j.contains("model")) {
    auto t = std::make_unique<BpeTokenizer>();
    try {
      TROUPE_TRY(t->init(std::move(j), path));
    } catch (const json::exception& e) {
      return invalid_input(path + ": bad tokenizer.json: " + e.what());
    }
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  return invalid_input(path + ": neither a troupe tokenizer (key \"troupe_tokenizer\") nor a Hugging Face tokenizer.json (key \"model\")");
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer_dir(const std::string& dir) {
  const fs::path d(dir);
  std::string file;
  if (fs::exists(d / kHfTokenizerFile)) file = (d / kHfTokenizerFile).string();
  else if (fs::exists(d / kTroupeTokenizerFile)) file = (d / kTroupeTokenizerFile).string();
  else return invalid_input((d / kHfTokenizerFile).string() + ": missing tokenizer (no tokenizer.json or troupe_tokenizer.json in " + dir + ")");
  TROUPE_ASSIGN_OR_RETURN(auto t, load_tokenizer_file(file));
  for (const char* side : {"tokenizer_config.json", "special_tokens_map.json"}) {
    std::ifstream in(d / side);
    if (!in) continue;
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_input((d / side).string() + ": not valid JSON");
    int32_t bos = special_from_config(j, "bos_token", *t), eos = special_from_config(j, "eos_token", *t),
            pad = special_from_config(j, "pad_token", *t);
    t->set_special_ids(bos >= 0 ? bos : t->bos_id(), eos >= 0 ? eos : t->eos_id(), pad >= 0 ? pad : t->pad_id());
  }
  return t;
}

}  // namespace troupe::policy::io
