// Constrained decoding for response_format json_object / json_schema (launch/serve/json_constraint.cpp): an
// incremental validator of JSON-object prefixes, and a policy::TokenConstraint that allows only the
// tokens whose text keeps the completion a prefix of one JSON object (and the stop tokens once the
// object is closed). Each token's text is computed once per tokenizer (TokenTexts).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/policy/decode_slots.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/serve/json_schema.h"

namespace troupe::serve {

// A byte-by-byte check that the text so far is a prefix of one JSON object (RFC 8259 values inside,
// nesting at most kMaxDepth, at most kMaxBlanks whitespace bytes in a row outside strings so that a
// model cannot pad forever). Bytes >= 0x80 are accepted inside strings only. Small and copyable.
class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxBlanks = 16;
  // False (the state is then unspecified) when c cannot extend the text.
  bool feed(unsigned char c);
  bool feed(const std::string& bytes);
  bool complete() const;  // the object is closed

 private:
  enum class Mode : uint8_t {
    start, value, first_value_or_end, first_key_or_end, key, colon, after_value, string, escape, unicode, number,
    literal, done
  };
  bool structural(unsigned char c);
  bool start_value(unsigned char c);
  bool open(char bracket);
  bool close(char bracket);
  bool number(unsigned char c);
  void value_done();
  char stack_[kMaxDepth] = {};
  uint8_t depth_ = 0;
  Mode mode_ = Mode::start;
  bool in_key_ = false;
  uint8_t sub_ = 0;      // number: its sub-state; unicode: hex digits left; literal: bytes matched
  uint8_t literal_ = 0;  // 0 true, 1 false, 2 null
  uint8_t blanks_ = 0;
};

// Every token's text (Tokenizer::decode of the token alone, special tokens empty).
struct TokenTexts {
  std::vector<std::string> text;
  static std::shared_ptr<const TokenTexts> of(const policy::io::Tokenizer& tok, int vocab);
};

// A constraint for one sequence: a JSON object, then one of `stops` (end-of-turn tokens).
std::shared_ptr<policy::TokenConstraint> json_object_constraint(std::shared_ptr<const TokenTexts> texts,
                                                                std::vector<int32_t> stops);
// The same for the documents `schema` admits (response_format json_schema).
std::shared_ptr<policy::TokenConstraint> json_schema_constraint(std::shared_ptr<const TokenTexts> texts,
                                                                std::shared_ptr<const JsonSchema> schema,
                                                                std::vector<int32_t> stops);

}  // namespace troupe::serve
