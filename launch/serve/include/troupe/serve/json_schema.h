// response_format json_schema (launch/serve/json_schema.cpp): a JSON schema compiled to the subset
// constrained decoding follows (object with properties and required, array with items, string,
// number, integer, boolean, null, enum of scalars, or any value), and SchemaPrefix, a byte-wise
// validator of the prefixes of the documents that schema admits. Anything outside the subset is an
// error naming its path, never ignored.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/base/result.h"

namespace troupe::serve {

struct JsonSchema {
  enum class Kind : uint8_t { any, object, array, string, number, integer, boolean, null, enumeration };
  struct Node {
    Kind kind = Kind::any;
    std::vector<std::string> names;  // object: its properties, in the schema's order ...
    std::vector<int> props;          // ... and their nodes
    uint64_t required = 0;           // object: bit i set when names[i] is required
    bool any_keys = false;           // object: any properties with any values (names unused)
    int items = -1;                  // array: the items' node (-1: any value)
    std::vector<std::string> values;  // enum: each value as JSON text
  };
  std::vector<Node> nodes;  // nodes[0] is the root
  static constexpr int kMaxProperties = 64;
  static constexpr int kMaxText = 64;  // longest property name or enum value text
  // One JSON object, anything inside (response_format json_object).
  static std::shared_ptr<const JsonSchema> any_object();
};

// `schema` (response_format.json_schema.schema); errors name the path, e.g. schema.properties.a.
Result<std::shared_ptr<const JsonSchema>> compile_json_schema(const nlohmann::ordered_json& schema);

// A byte-by-byte check that the text so far is a prefix of a document `schema` admits (RFC 8259
// values; nesting at most kMaxDepth; at most kMaxBlanks whitespace bytes in a row outside strings,
// so that a model cannot pad forever; bytes >= 0x80 only inside strings). Objects take only their
// declared properties, each at most once, and close once the required ones are there. feed() is
// false (the state then unspecified) for a byte that cannot extend the text. Small and copyable.
class SchemaPrefix {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxBlanks = 16;
  explicit SchemaPrefix(const JsonSchema* schema) : schema_(schema) {}
  bool feed(unsigned char c);
  bool feed(const std::string& bytes);
  bool complete() const;

 private:
  enum class Mode : uint8_t {
    start, value, first_value_or_end, first_key_or_end, key, key_text, colon, after_value, string, escape, unicode,
    number, literal, enumeration, done
  };
  struct Frame {
    int16_t node = -1;  // -1: any value
    char bracket = '{';
    uint64_t used = 0;  // object: the properties given so far
  };
  const JsonSchema::Node* node(int i) const { return i < 0 ? nullptr : &schema_->nodes[static_cast<size_t>(i)]; }
  bool structural(unsigned char c);
  bool start_value(unsigned char c, int node_index);
  bool key_byte(unsigned char c);
  bool key_end();
  bool enum_byte(unsigned char c);
  bool open(char bracket, int node_index);
  bool close(char bracket);
  bool number(unsigned char c);
  bool more_keys() const;
  void value_done();
  const JsonSchema* schema_;
  Frame stack_[kMaxDepth];
  uint8_t depth_ = 0;
  Mode mode_ = Mode::start;
  int16_t pending_ = 0;  // the node of the value about to start
  int16_t enum_node_ = -1;
  bool integer_ = false;
  bool in_key_ = false;  // reading an object key (escapes return to it)
  uint8_t sub_ = 0, literal_ = 0, blanks_ = 0, len_ = 0;
  char buf_[JsonSchema::kMaxText + 1] = {};  // a key's or enum value's bytes so far
};

}  // namespace troupe::serve
