// policy.chat_template: the Jinja subset renders the official chat templates of SmolLM2, Llama 3.2,
// Qwen2.5 and Qwen3 byte-identically to transformers (tests/chat_template/references.json, made by
// tests/chat_template/make_references.py); whitespace control and the errors for refused syntax.
#include "troupe/policy/io/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "troupe/base/build_config.h"

namespace fs = std::filesystem;
using namespace troupe::policy::io;
using ojson = nlohmann::ordered_json;

namespace {

fs::path fixture_dir() { return fs::path(TROUPE_SOURCE_DIR) / "tests" / "chat_template"; }

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string render(const std::string& src, const ojson& vars = ojson::object()) {
  auto t = ChatTemplate::parse(src);
  if (!t.ok()) return "PARSE ERROR: " + t.error().message;
  auto r = t->render(vars);
  return r.ok() ? *r : "RENDER ERROR: " + r.error().message;
}

}  // namespace

TEST(ChatTemplate, MatchesTransformersReferences) {
  ojson refs = ojson::parse(read(fixture_dir() / "references.json"));
  ASSERT_GE(refs.size(), 20u);
  std::map<std::string, int> per_template;
  for (size_t k = 0; k < refs.size(); ++k) {
    const ojson& c = refs[k];
    std::string name = c["template"].get<std::string>();
    auto t = ChatTemplate::parse(read(fixture_dir() / "templates" / name), name);
    ASSERT_TRUE(t.ok()) << t.error().message;
    ChatRenderOptions o;
    o.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    o.tools = c["tools"];
    o.extra = c["variables"];
    auto r = render_chat(*t, c["messages"], o);
    ASSERT_TRUE(r.ok()) << "case " << k << ": " << r.error().message;
    EXPECT_EQ(*r, c["expected"].get<std::string>()) << "case " << k << " (" << name << ")";
    ++per_template[name];
  }
  EXPECT_EQ(per_template.size(), 4u);
  for (auto& [name, n] : per_template) EXPECT_GE(n, 5) << name;
}

TEST(ChatTemplate, WhitespaceControl) {
  // trim_blocks removes the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("{% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");
  EXPECT_EQ(render("x  {%- if true -%}  y  {%- endif %}"), "xy");
  EXPECT_EQ(render("{{ 'a' }}\n{# note #}\n  {{- 'b' }}"), "a\nb");
  EXPECT_EQ(render("{%+ if true %}z{% endif +%}\n"), "z\n");
}

TEST(ChatTemplate, ExpressionsFiltersAndScopes) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 'a' ~ 1 ~ none }}"), "7 3 3.5 2 a1None");
  EXPECT_EQ(render("{{ [1, 2, 3][::-1] }} {{ 'hello'[1:3] }} {{ {'a': 1}.items() | list }}"),
            "[3, 2, 1] el [['a', 1]]");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
                   {{"xs", {5, 6}}}),
            "0TrueFalse2;1FalseTrue2;");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"),
            "4");
  EXPECT_EQ(render("{{ xs | selectattr('on') | map(attribute='n') | join(',') }}",
                   {{"xs", ojson::parse(R"([{"n":"a","on":true},{"n":"b","on":false},{"n":"c","on":1}])")}}),
            "a,c");
  EXPECT_EQ(render("{{ ' a b '.split() }} {{ 'a,b'.split(',') }} {{ 'xxhixx'.strip('x') }} {{ d.get('k', 3) }}",
                   {{"d", ojson::object()}}),
            "['a', 'b'] ['a', 'b'] hi 3");
  EXPECT_EQ(render("{{ v | tojson }} {{ v | tojson(indent=2) }}", {{"v", ojson::parse(R"({"b":[1,"é"],"a":{}})")}}),
            "{\"b\": [1, \"é\"], \"a\": {}} {\n  \"b\": [\n    1,\n    \"é\"\n  ],\n  \"a\": {}\n}");
  EXPECT_EQ(render("{% macro m(a, b='!') %}<{{ a }}{{ b }}>{% endmacro %}{{ m('x') }}{{ m('y', b='?') }}"), "<x!><y?>");
  EXPECT_EQ(render("{{ u is defined }}{{ n is none }}{{ 's' is string }}{{ {} is mapping }}{{ [] is sequence }}",
                   {{"n", nullptr}}),
            "FalseTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 'x' if false else 'y' }}{{ u | default('d') }}{{ 'ab' | upper | length }}"), "yd2");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"), "13");
}

TEST(ChatTemplate, ErrorsNameLineColumnAndConstruct) {
  std::string e = render("ok\n  {{ x | wordwrap }}");
  EXPECT_NE(e.find("PARSE ERROR: chat template:2:10: unsupported filter 'wordwrap'"), std::string::npos) << e;
  e = render("{% include 'x.jinja' %}");
  EXPECT_NE(e.find(":1:4: unsupported statement '{% include %}'"), std::string::npos) << e;
  e = render("{% for x in xs recursive %}{% endfor %}");
  EXPECT_NE(e.find("recursive"), std::string::npos) << e;
  e = render("{% if true %}never closed");
  EXPECT_NE(e.find("missing {% endif %}"), std::string::npos) << e;
  e = render("{{ 'unterminated }}");
  EXPECT_NE(e.find("PARSE ERROR"), std::string::npos) << e;
  e = render("\n{{ raise_exception('roles must alternate') }}");
  EXPECT_NE(e.find("RENDER ERROR: chat template:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("roles must alternate"), std::string::npos) << e;
  e = render("{{ x is divisible }}");
  EXPECT_NE(e.find("unsupported test 'is divisible'"), std::string::npos) << e;
  e = render("{{ 'a' + 1 }}");
  EXPECT_NE(e.find("RENDER ERROR"), std::string::npos) << e;
}
