// Tokenizers: one interface, two implementations — troupe's character/byte tokenizer (its own
// JSON file, troupe_tokenizer.json) and Hugging Face tokenizer.json BPE (byte-level, or SentencePiece-style
// with byte_fallback). encode never adds BOS/EOS; special/added tokens written literally in the text encode
// to their ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::policy::io {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "byte", "char" or "bpe"
  // Errors only where a character has no id (char tokenizer without an unk token).
  virtual Result<std::vector<int32_t>> encode(std::string_view text) const = 0;
  // Special tokens are written as their text unless skip_special; unknown ids are an error.
  virtual Result<std::string> decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual int vocab_size() const = 0;  // one past the largest id
  virtual int32_t token_id(std::string_view token) const = 0;  // -1 if absent
  int32_t bos_id() const { return bos_; }  // -1 = none
  int32_t eos_id() const { return eos_; }
  int32_t pad_id() const { return pad_; }
  void set_special_ids(int32_t bos, int32_t eos, int32_t pad) { bos_ = bos, eos_ = eos, pad_ = pad; }
  // Writes the tokenizer's file into dir (troupe_tokenizer.json or tokenizer.json).
  virtual Status save(const std::string& dir) const = 0;

 protected:
  int32_t bos_ = -1, eos_ = -1, pad_ = -1;
};

// troupe's own tokenizer for built-in tasks (file format in policy/io/README.md).
//   kind "byte": ids = specials (0..S-1) then the 256 bytes (S + b); decodes any UTF-8.
//   kind "char": ids = specials then each code point of `chars` in order; unknown characters map to
//   the special token named by `unk` or are an error.
struct CharTokenizerSpec {
  std::string kind = "byte";
  std::vector<std::string> special_tokens = {"<pad>", "<bos>", "<eos>"};
  std::string pad = "<pad>", bos = "<bos>", eos = "<eos>", unk;
  std::string chars;  // kind "char" only, UTF-8
};
Result<std::unique_ptr<Tokenizer>> make_char_tokenizer(const CharTokenizerSpec& spec);

constexpr const char* kTroupeTokenizerFile = "troupe_tokenizer.json";
constexpr const char* kHfTokenizerFile = "tokenizer.json";

// Loads a troupe_tokenizer.json or a Hugging Face tokenizer.json (by content); errors name the file.
Result<std::unique_ptr<Tokenizer>> load_tokenizer_file(const std::string& path);
// dir/tokenizer.json, else dir/troupe_tokenizer.json; bos/eos/pad from dir/tokenizer_config.json
// or special_tokens_map.json where present. Error if neither file exists.
Result<std::unique_ptr<Tokenizer>> load_tokenizer_dir(const std::string& dir);

// GPT-2's reversible byte -> printable code point map used by byte-level BPE.
const std::vector<uint32_t>& gpt2_byte_to_codepoint();

}  // namespace troupe::policy::io
