// response_format json_schema (json_schema.h): the schema compiled to the subset constrained
// decoding follows, and SchemaPrefix. Invariant: SchemaPrefix accepts a byte only if the text stays
// a prefix of a document the compiled schema admits (and that RFC 8259 admits).
#include "troupe/serve/json_schema.h"

#include <cctype>
#include <cstring>
#include <set>

namespace troupe::serve {

namespace {

using ojson = nlohmann::ordered_json;
using Kind = JsonSchema::Kind;
constexpr const char* kLiterals[3] = {"true", "false", "null"};
constexpr int kMaxSchemaDepth = 16;

bool is_blank(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

Status supported_keywords(const ojson& s, const std::string& path) {
  static const std::set<std::string> ok = {"type", "properties", "required", "additionalProperties", "items",
                                           "enum", "description", "title", "$schema", "strict"};
  for (const auto& [k, v] : s.items())
    if (!ok.count(k))
      return invalid_input(path + "." + k + " is not supported by constrained decoding (supported: type object/array/"
                           "string/number/integer/boolean/null, properties, required, items, enum)");
  return {};
}

Result<int> compile_node(const ojson& s, const std::string& path, JsonSchema& out, int depth);

Status compile_object(const ojson& s, const std::string& path, JsonSchema& out, int idx, int depth) {
  if (s.contains("additionalProperties") && s["additionalProperties"] != false)
    return invalid_input(path + ".additionalProperties: only false (the default here) is supported");
  if (s.contains("properties")) {
    const ojson& props = s["properties"];
    if (!props.is_object()) return invalid_input(path + ".properties must be an object");
    if (props.size() > JsonSchema::kMaxProperties)
      return invalid_input(path + ".properties: at most " + std::to_string(JsonSchema::kMaxProperties) + " properties");
    for (const auto& [name, sub] : props.items()) {
      if (name.empty() || name.size() > JsonSchema::kMaxText)
        return invalid_input(path + ".properties: a property name must have 1 to " +
                             std::to_string(JsonSchema::kMaxText) + " bytes: '" + name + "'");
      for (unsigned char c : name)
        if (c < 0x20 || c == '"' || c == '\\')
          return invalid_input(path + ".properties: the name '" + name + "' needs escaping (not supported)");
      TROUPE_ASSIGN_OR_RETURN(const int child, compile_node(sub, path + ".properties." + name, out, depth + 1));
      out.nodes[idx].names.push_back(name);
      out.nodes[idx].props.push_back(child);
    }
  }
  if (s.contains("required")) {
    if (!s["required"].is_array()) return invalid_input(path + ".required must be a list of property names");
    const auto& names = out.nodes[idx].names;
    for (const auto& r : s["required"]) {
      size_t i = 0;
      while (r.is_string() && i < names.size() && names[i] != r.get<std::string>()) ++i;
      if (!r.is_string() || i == names.size())
        return invalid_input(path + ".required: " + r.dump() + " is not one of the properties");
      out.nodes[idx].required |= uint64_t{1} << i;
    }
  }
  return {};
}

Result<int> compile_node(const ojson& s, const std::string& path, JsonSchema& out, int depth) {
  if (depth > kMaxSchemaDepth) return invalid_input(path + ": nested deeper than " + std::to_string(kMaxSchemaDepth));
  if (!s.is_object()) return invalid_input(path + " must be a schema object");
  TROUPE_TRY(supported_keywords(s, path));
  const int idx = static_cast<int>(out.nodes.size());
  out.nodes.emplace_back();
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty()) return invalid_input(path + ".enum must be a non-empty list");
    out.nodes[idx].kind = Kind::enumeration;
    for (const auto& v : s["enum"]) {
      if (v.is_structured()) return invalid_input(path + ".enum: only strings, numbers, booleans and null");
      std::string text = v.dump();
      if (text.size() > JsonSchema::kMaxText)
        return invalid_input(path + ".enum: " + text + " is longer than " + std::to_string(JsonSchema::kMaxText) +
                             " bytes");
      out.nodes[idx].values.push_back(std::move(text));
    }
    return idx;
  }
  if (!s.contains("type")) return idx;  // any value
  static const std::pair<const char*, Kind> kinds[] = {
      {"object", Kind::object}, {"array", Kind::array}, {"string", Kind::string}, {"number", Kind::number},
      {"integer", Kind::integer}, {"boolean", Kind::boolean}, {"null", Kind::null}};
  const ojson& t = s["type"];
  bool known = false;
  for (const auto& [name, kind] : kinds)
    if (t.is_string() && t == name) out.nodes[idx].kind = kind, known = true;
  if (!known) return invalid_input(path + ".type: " + t.dump() + " (one of object, array, string, number, integer, "
                                   "boolean, null; a list of types is not supported)");
  if (out.nodes[idx].kind == Kind::object) TROUPE_TRY(compile_object(s, path, out, idx, depth));
  if (out.nodes[idx].kind == Kind::array && s.contains("items")) {
    TROUPE_ASSIGN_OR_RETURN(const int child, compile_node(s["items"], path + ".items", out, depth + 1));
    out.nodes[idx].items = child;
  }
  return idx;
}

}  // namespace

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  static const std::shared_ptr<const JsonSchema> s = [] {
    auto out = std::make_shared<JsonSchema>();
    out->nodes.emplace_back();
    out->nodes[0].kind = Kind::object;
    out->nodes[0].any_keys = true;
    return std::shared_ptr<const JsonSchema>(std::move(out));
  }();
  return s;
}

Result<std::shared_ptr<const JsonSchema>> compile_json_schema(const ojson& schema) {
  auto out = std::make_shared<JsonSchema>();
  TROUPE_ASSIGN_OR_RETURN(const int root, compile_node(schema, "schema", *out, 0));
  (void)root;  // always 0
  return std::shared_ptr<const JsonSchema>(std::move(out));
}

bool SchemaPrefix::complete() const { return mode_ == Mode::done; }

bool SchemaPrefix::feed(const std::string& bytes) {
  for (unsigned char c : bytes)
    if (!feed(c)) return false;
  return true;
}

void SchemaPrefix::value_done() { mode_ = depth_ == 0 ? Mode::done : Mode::after_value; }

bool SchemaPrefix::open(char bracket, int node_index) {
  if (depth_ == kMaxDepth) return false;
  stack_[depth_++] = Frame{static_cast<int16_t>(node_index), bracket, 0};
  mode_ = bracket == '{' ? Mode::first_key_or_end : Mode::first_value_or_end;
  return true;
}

bool SchemaPrefix::close(char bracket) {
  if (depth_ == 0) return false;
  const Frame& f = stack_[depth_ - 1];
  if (bracket != (f.bracket == '{' ? '}' : ']')) return false;
  const JsonSchema::Node* n = node(f.node);
  if (bracket == '}' && n && (f.used & n->required) != n->required) return false;
  --depth_;
  value_done();
  return true;
}

// Another property may follow (any value's objects: always).
bool SchemaPrefix::more_keys() const {
  const Frame& f = stack_[depth_ - 1];
  const JsonSchema::Node* n = node(f.node);
  return !n || f.used != (n->names.size() == 64 ? ~uint64_t{0} : (uint64_t{1} << n->names.size()) - 1);
}

bool SchemaPrefix::start_value(unsigned char c, int node_index) {
  const JsonSchema::Node* n = node(node_index);
  const Kind k = n ? n->kind : Kind::any;
  if (k == Kind::enumeration) {
    mode_ = Mode::enumeration;
    enum_node_ = static_cast<int16_t>(node_index);
    len_ = 0;
    return enum_byte(c);
  }
  if (c == '{' && (k == Kind::any || k == Kind::object))
    return open('{', k == Kind::any || n->any_keys ? -1 : node_index);
  if (c == '[' && (k == Kind::any || k == Kind::array)) return open('[', k == Kind::any ? -1 : n->items);
  if (c == '"' && (k == Kind::any || k == Kind::string)) {
    mode_ = Mode::string;
    return true;
  }
  if ((c == '-' || is_digit(c)) && (k == Kind::any || k == Kind::number || k == Kind::integer)) {
    mode_ = Mode::number;
    integer_ = k == Kind::integer;
    sub_ = c == '-' ? 0 : c == '0' ? 1 : 2;
    return true;
  }
  for (uint8_t i = 0; i < 3; ++i) {
    const bool fits = k == Kind::any || (i < 2 ? k == Kind::boolean : k == Kind::null);
    if (fits && c == static_cast<unsigned char>(kLiterals[i][0])) {
      mode_ = Mode::literal;
      literal_ = i;
      sub_ = 1;
      return true;
    }
  }
  return false;
}

bool SchemaPrefix::enum_byte(unsigned char c) {
  const auto& values = node(enum_node_)->values;
  bool extends = false, whole = false;
  for (const auto& v : values) {
    if (v.size() > len_ && std::memcmp(v.data(), buf_, len_) == 0 && static_cast<unsigned char>(v[len_]) == c)
      extends = true;
    if (v.size() == len_ && std::memcmp(v.data(), buf_, len_) == 0) whole = true;
  }
  if (extends && len_ < JsonSchema::kMaxText) {
    buf_[len_++] = static_cast<char>(c);
    return true;
  }
  if (!whole) return false;
  value_done();  // the value is whole: c is the next structural byte
  return structural(c);
}

bool SchemaPrefix::key_byte(unsigned char c) {
  const Frame& f = stack_[depth_ - 1];
  const JsonSchema::Node* n = node(f.node);
  if (c == '"') return key_end();
  if (!n) {  // any value's object: any key
    if (c == '\\') mode_ = Mode::escape;
    return c >= 0x20;
  }
  if (len_ >= JsonSchema::kMaxText) return false;
  for (size_t i = 0; i < n->names.size(); ++i) {
    const std::string& name = n->names[i];
    if (!(f.used >> i & 1) && name.size() > len_ && std::memcmp(name.data(), buf_, len_) == 0 &&
        static_cast<unsigned char>(name[len_]) == c) {
      buf_[len_++] = static_cast<char>(c);
      return true;
    }
  }
  return false;
}

bool SchemaPrefix::key_end() {
  Frame& f = stack_[depth_ - 1];
  const JsonSchema::Node* n = node(f.node);
  mode_ = Mode::colon;
  in_key_ = false;
  if (!n) {
    pending_ = -1;
    return true;
  }
  for (size_t i = 0; i < n->names.size(); ++i)
    if (!(f.used >> i & 1) && n->names[i].size() == len_ && std::memcmp(n->names[i].data(), buf_, len_) == 0) {
      f.used |= uint64_t{1} << i;
      pending_ = static_cast<int16_t>(n->props[i]);
      return true;
    }
  return false;
}

// Number sub-states: 0 after '-', 1 a leading 0, 2 integer digits, 3 after '.', 4 fraction digits,
// 5 after 'e', 6 after the exponent's sign, 7 exponent digits; 1, 2, 4 and 7 may end the number.
// Integers take no fraction or exponent.
bool SchemaPrefix::number(unsigned char c) {
  const bool d = is_digit(c), e = !integer_ && (c == 'e' || c == 'E'), dot = !integer_ && c == '.';
  switch (sub_) {
    case 0: if (d) { sub_ = c == '0' ? 1 : 2; return true; } return false;
    case 1: if (dot) { sub_ = 3; return true; } if (e) { sub_ = 5; return true; } break;
    case 2: if (d) return true; if (dot) { sub_ = 3; return true; } if (e) { sub_ = 5; return true; } break;
    case 3: if (d) { sub_ = 4; return true; } return false;
    case 4: if (d) return true; if (e) { sub_ = 5; return true; } break;
    case 5: if (c == '+' || c == '-') { sub_ = 6; return true; } if (d) { sub_ = 7; return true; } return false;
    case 6: if (d) { sub_ = 7; return true; } return false;
    default: if (d) return true; break;
  }
  value_done();
  return structural(c);
}

bool SchemaPrefix::feed(unsigned char c) {
  switch (mode_) {
    case Mode::key_text: return key_byte(c);
    case Mode::string:
      if (c == '"') {
        value_done();
        return true;
      }
      if (c == '\\') mode_ = Mode::escape;
      return c >= 0x20;
    case Mode::escape:
      if (c == 'u') {
        mode_ = Mode::unicode;
        sub_ = 4;
        return true;
      }
      mode_ = in_key_ ? Mode::key_text : Mode::string;
      return c != 0 && std::strchr("\"\\/bfnrt", c) != nullptr;
    case Mode::unicode:
      if (!std::isxdigit(c)) return false;
      if (--sub_ == 0) mode_ = in_key_ ? Mode::key_text : Mode::string;
      return true;
    case Mode::number: return number(c);
    case Mode::literal:
      if (c != static_cast<unsigned char>(kLiterals[literal_][sub_])) return false;
      if (kLiterals[literal_][++sub_] == '\0') value_done();
      return true;
    case Mode::enumeration: return enum_byte(c);
    default: return structural(c);
  }
}

bool SchemaPrefix::structural(unsigned char c) {
  if (mode_ == Mode::done) return false;
  if (is_blank(c)) return ++blanks_ <= kMaxBlanks;
  blanks_ = 0;
  switch (mode_) {
    case Mode::start: return start_value(c, 0);
    case Mode::first_value_or_end:
      if (c == ']') return close(']');
      return start_value(c, stack_[depth_ - 1].node);
    case Mode::value: return start_value(c, pending_);
    case Mode::first_key_or_end:
      if (c == '}') return close('}');
      [[fallthrough]];
    case Mode::key:
      if (c != '"' || !more_keys()) return false;  // an object without properties left takes no key
      mode_ = Mode::key_text;
      in_key_ = true;
      len_ = 0;
      return true;
    case Mode::colon:
      if (c != ':') return false;
      mode_ = Mode::value;
      return true;
    case Mode::after_value: {
      const Frame& f = stack_[depth_ - 1];
      if (c == ',') {
        if (f.bracket == '[') {
          pending_ = f.node;
          mode_ = Mode::value;
          return true;
        }
        if (!more_keys()) return false;
        mode_ = Mode::key;
        return true;
      }
      return (c == '}' || c == ']') && close(static_cast<char>(c));
    }
    default: return false;
  }
}

}  // namespace troupe::serve
