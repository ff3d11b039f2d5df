// Constrained decoding for response_format json_object / json_schema (launch/serve/json_constraint.cpp):
// a policy::TokenConstraint that allows only the tokens whose text keeps the completion a prefix of
// one JSON object (any, or one a schema admits: SchemaPrefix, json_schema.h), and the stop tokens
// once it is closed. Each token's text is computed once per tokenizer (TokenTexts).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/policy/decode_slots.h"
#include "troupe/policy/io/tokenizer.h"
#include "troupe/serve/json_schema.h"

namespace troupe::serve {

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
