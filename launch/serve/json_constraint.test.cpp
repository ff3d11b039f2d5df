// Constrained JSON decoding: SchemaPrefix over JsonSchema::any_object (json_object) accepts exactly
// the prefixes of one JSON object, over a compiled schema those of the documents it admits (whole
// documents and their every prefix, and malformed ones); schema compile errors name the path; the
// token mask allows only tokens that keep the text such a prefix, the stop tokens once it is closed.
#include <gtest/gtest.h>

#include <cmath>

#include "troupe/serve/json_constraint.h"

using namespace troupe::serve;

namespace {
bool prefix_ok(const std::string& s) {
  SchemaPrefix p(JsonSchema::any_object().get());
  return p.feed(s);
}
bool whole(const std::string& s) {
  SchemaPrefix p(JsonSchema::any_object().get());
  return p.feed(s) && p.complete();
}
}  // namespace

TEST(JsonObject, AcceptsObjectsAndEveryPrefix) {
  for (const std::string doc :
       {R"({})", R"({"a": 1})", R"( {"a": [1, -2.5e+3, 0, 0.25, true, false, null, "x\"\\\u00e9\n"], "b": {"c": {}}})",
        "{\n  \"k\": \"\xC3\xA9t\xC3\xA9\",\n  \"n\": -0.0E-1\n}", R"({"a":[],"b":[[]],"c":[{}]})"}) {
    EXPECT_TRUE(whole(doc)) << doc;
    for (size_t n = 0; n < doc.size(); ++n) EXPECT_TRUE(prefix_ok(doc.substr(0, n))) << doc.substr(0, n);
    SchemaPrefix p(JsonSchema::any_object().get());
    EXPECT_TRUE(p.feed(doc.substr(0, doc.size() - 1)));
    EXPECT_FALSE(p.complete()) << doc;
  }
}

TEST(JsonObject, RefusesWhatNoObjectStartsWith) {
  for (const std::string bad :
       {"[", "1", "\"a\"", "x", "{a", "{\"a\" 1", "{\"a\":}", "{\"a\":1,}", "{\"a\":01", "{\"a\":-}", "{\"a\":1.}",
        "{\"a\":1e}", "{\"a\":tru}", "{\"a\":nul,", "{\"a\":[1}", "{\"a\":\"\x01\"}", "{\"a\":\"\\q\"}",
        "{\"a\":\"\\u12G\"}", "{} ", "{}x", "{]", "{\"a\":[1,]}"})
    EXPECT_FALSE(prefix_ok(bad) && whole(bad + "}")) << bad;
  EXPECT_FALSE(prefix_ok("{}x"));
  EXPECT_FALSE(prefix_ok("{\"a\":01"));
  EXPECT_FALSE(prefix_ok(std::string("{") + std::string(SchemaPrefix::kMaxBlanks + 1, ' ')));
  EXPECT_TRUE(prefix_ok(std::string("{") + std::string(SchemaPrefix::kMaxBlanks, ' ')));
  std::string deep(SchemaPrefix::kMaxDepth, '[');
  deep[0] = '{';
  EXPECT_FALSE(prefix_ok("{\"a\":" + deep));
}

TEST(JsonObjectConstraint, MasksTokensThatBreakTheObject) {
  auto texts = std::make_shared<TokenTexts>();
  texts->text = {"", "{", "}", "\"a\"", ":", "1", "x", " ", "{\"b\":2}", ""};  // 0 and 9: special/stop
  const int V = static_cast<int>(texts->text.size());
  auto c = json_object_constraint(texts, {9});
  auto allowed = [&] {
    std::vector<float> logits(V, 0.0f);
    c->mask(logits.data(), V);
    std::string out;
    for (int v = 0; v < V; ++v) out += std::isinf(logits[v]) ? '.' : 'x';
    return out;
  };
  EXPECT_EQ(allowed(), ".x.....xx.");  // '{', ' ', a whole object
  c->accept(1);
  EXPECT_EQ(allowed(), "..xx...x..");  // '}', a key, ' '
  c->accept(3);
  EXPECT_EQ(allowed(), "....x..x..");
  c->accept(4);
  c->accept(5);
  EXPECT_EQ(allowed(), "..x..x.x..");  // more digits, '}', ' '
  c->accept(2);
  EXPECT_EQ(allowed(), ".........x");  // closed: only the stop token
}

namespace {
std::shared_ptr<const JsonSchema> schema_of(const std::string& text) {
  auto s = compile_json_schema(nlohmann::ordered_json::parse(text));
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  return s.ok() ? *s : nullptr;
}
bool schema_prefix(const std::shared_ptr<const JsonSchema>& s, const std::string& text) {
  SchemaPrefix p(s.get());
  return p.feed(text);
}
bool schema_whole(const std::shared_ptr<const JsonSchema>& s, const std::string& text) {
  SchemaPrefix p(s.get());
  return p.feed(text) && p.complete();
}
const char* kPerson = R"({"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "score": {"type": "number"},
    "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
    "color": {"enum": ["red", "green", 7, null]}, "extra": {}, "none": {"type": "null"},
    "inner": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
  "required": ["name", "age"], "additionalProperties": false})";
}  // namespace

TEST(SchemaPrefix, AcceptsWhatTheSchemaAdmitsAndEveryPrefix) {
  auto s = schema_of(kPerson);
  ASSERT_TRUE(s);
  for (const std::string doc :
       {R"({"name": "Al", "age": 3})", R"({"age": -12, "name": "\"q\"\u00e9"})",
        R"({"name":"a","age":0,"score":-1.5e3,"ok":false,"tags":["x","y"],"color":"green","extra":{"k":[1,{}]},"none":null,"inner":{"x":1}})",
        R"({"name": "a", "age": 1, "color": 7, "tags": []})", R"({"name": "a", "age": 1, "color": null})"}) {
    EXPECT_TRUE(schema_whole(s, doc)) << doc;
    for (size_t n = 0; n < doc.size(); ++n) EXPECT_TRUE(schema_prefix(s, doc.substr(0, n))) << doc.substr(0, n);
  }
}

TEST(SchemaPrefix, RefusesWhatTheSchemaDoesNot) {
  auto s = schema_of(kPerson);
  ASSERT_TRUE(s);
  for (const std::string bad :
       {R"({"nam)" "x", R"({"name": 1)", R"({"name": "a"})", R"({"age": 1.5)", R"({"age": 1e3)",
        R"({"name": "a", "age": 1, "name")", R"({"other")", R"({"name": "a", "age": 1, "ok": 1)",
        R"({"name": "a", "age": 1, "tags": [1)", R"({"name": "a", "age": 1, "color": "blue")",
        R"({"name": "a", "age": 1, "color": 70)", R"({"name": "a", "age": 1, "inner": {}})", R"([)",
        R"({"name": "a", "age": 1, "none": 0)", R"({"name": "a", "age": 1,})", R"({"name": "a", "age": 1}})"})
    EXPECT_FALSE(schema_prefix(s, bad)) << bad;
  auto any = schema_of("{}");  // any value, at the root too
  EXPECT_TRUE(schema_whole(any, R"([1, "a", {"b": null}])"));
  EXPECT_TRUE(schema_whole(schema_of(R"({"type": "object"})"), "{}"));
  EXPECT_FALSE(schema_prefix(schema_of(R"({"type": "object"})"), R"({")"));
}

TEST(SchemaPrefix, CompileErrorsNameThePath) {
  for (const auto& [text, path] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}})", "schema.properties.a.pattern"},
           {R"({"anyOf": []})", "schema.anyOf"},
           {R"({"type": ["string", "null"]})", "schema.type"},
           {R"({"type": "object", "additionalProperties": true})", "schema.additionalProperties"},
           {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "schema.required"},
           {R"({"type": "array", "items": {"$ref": "#"}})", "schema.items.$ref"}}) {
    auto s = compile_json_schema(nlohmann::ordered_json::parse(text));
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.error().message.find(path), std::string::npos) << s.error().message;
  }
}
