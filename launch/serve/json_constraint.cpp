// response_format json_object and json_schema (json_constraint.h): the JSON-object prefix validator
// and the token mask built on it or on SchemaPrefix. Invariant: a token is allowed only if feeding
// its bytes to a copy of the state succeeds, so every completion is a prefix of one admitted
// document (whole once a stop token is drawn).
#include "troupe/serve/json_constraint.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

namespace troupe::serve {

namespace {
constexpr const char* kLiterals[3] = {"true", "false", "null"};
bool is_blank(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
}  // namespace

bool JsonPrefix::complete() const { return mode_ == Mode::done; }

bool JsonPrefix::feed(const std::string& bytes) {
  for (unsigned char c : bytes)
    if (!feed(c)) return false;
  return true;
}

void JsonPrefix::value_done() { mode_ = depth_ == 0 ? Mode::done : Mode::after_value; }

bool JsonPrefix::open(char bracket) {
  if (depth_ == kMaxDepth) return false;
  stack_[depth_++] = bracket;
  mode_ = bracket == '{' ? Mode::first_key_or_end : Mode::first_value_or_end;
  return true;
}

bool JsonPrefix::close(char bracket) {
  if (depth_ == 0 || bracket != (stack_[depth_ - 1] == '{' ? '}' : ']')) return false;
  --depth_;
  value_done();
  return true;
}

bool JsonPrefix::start_value(unsigned char c) {
  if (c == '{' || c == '[') return open(static_cast<char>(c));
  if (c == '"') {
    mode_ = Mode::string;
    in_key_ = false;
    return true;
  }
  if (c == '-' || is_digit(c)) {
    mode_ = Mode::number;
    sub_ = c == '-' ? 0 : c == '0' ? 1 : 2;
    return true;
  }
  for (uint8_t i = 0; i < 3; ++i)
    if (c == static_cast<unsigned char>(kLiterals[i][0])) {
      mode_ = Mode::literal;
      literal_ = i;
      sub_ = 1;
      return true;
    }
  return false;
}

// Number sub-states: 0 after '-', 1 a leading 0, 2 integer digits, 3 after '.', 4 fraction digits,
// 5 after 'e', 6 after the exponent's sign, 7 exponent digits. 1, 2, 4 and 7 may end the number.
bool JsonPrefix::number(unsigned char c) {
  const bool d = is_digit(c), e = c == 'e' || c == 'E';
  switch (sub_) {
    case 0: if (d) { sub_ = c == '0' ? 1 : 2; return true; } return false;
    case 1: if (c == '.') { sub_ = 3; return true; } if (e) { sub_ = 5; return true; } break;
    case 2: if (d) return true; if (c == '.') { sub_ = 3; return true; } if (e) { sub_ = 5; return true; } break;
    case 3: if (d) { sub_ = 4; return true; } return false;
    case 4: if (d) return true; if (e) { sub_ = 5; return true; } break;
    case 5: if (c == '+' || c == '-') { sub_ = 6; return true; } if (d) { sub_ = 7; return true; } return false;
    case 6: if (d) { sub_ = 7; return true; } return false;
    default: if (d) return true; break;
  }
  value_done();  // the number ended: c is the next structural byte
  return structural(c);
}

bool JsonPrefix::feed(unsigned char c) {
  switch (mode_) {
    case Mode::string:
      if (c == '"') {
        if (in_key_) mode_ = Mode::colon;
        else value_done();
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
      mode_ = Mode::string;
      return c != 0 && std::strchr("\"\\/bfnrt", c) != nullptr;
    case Mode::unicode:
      if (!std::isxdigit(c)) return false;
      if (--sub_ == 0) mode_ = Mode::string;
      return true;
    case Mode::number: return number(c);
    case Mode::literal:
      if (c != static_cast<unsigned char>(kLiterals[literal_][sub_])) return false;
      if (kLiterals[literal_][++sub_] == '\0') value_done();
      return true;
    default: return structural(c);
  }
}

bool JsonPrefix::structural(unsigned char c) {
  if (mode_ == Mode::done) return false;
  if (is_blank(c)) return ++blanks_ <= kMaxBlanks;
  blanks_ = 0;
  switch (mode_) {
    case Mode::start: return c == '{' && open('{');
    case Mode::first_value_or_end:
      if (c == ']') return close(']');
      return start_value(c);
    case Mode::value: return start_value(c);
    case Mode::first_key_or_end:
      if (c == '}') return close('}');
      [[fallthrough]];
    case Mode::key:
      if (c != '"') return false;
      mode_ = Mode::string;
      in_key_ = true;
      return true;
    case Mode::colon:
      if (c != ':') return false;
      mode_ = Mode::value;
      return true;
    case Mode::after_value:
      if (c == ',') {
        mode_ = stack_[depth_ - 1] == '{' ? Mode::key : Mode::value;
        return true;
      }
      return (c == '}' || c == ']') && close(static_cast<char>(c));
    default: return false;
  }
}

std::shared_ptr<const TokenTexts> TokenTexts::of(const policy::io::Tokenizer& tok, int vocab) {
  auto t = std::make_shared<TokenTexts>();
  t->text.resize(static_cast<size_t>(std::max(vocab, 0)));
  for (int v = 0; v < vocab; ++v) {
    auto d = tok.decode({v}, true);
    if (d.ok()) t->text[static_cast<size_t>(v)] = std::move(d).value();
  }
  return t;
}

namespace {

// State: JsonPrefix or SchemaPrefix (feed(bytes), complete(), copyable).
template <class State>
class JsonConstraint : public policy::TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const TokenTexts> texts, std::vector<int32_t> stops, State state,
                 std::shared_ptr<const JsonSchema> schema = nullptr)
      : texts_(std::move(texts)), stops_(std::move(stops)), schema_(std::move(schema)), state_(state) {}

  void mask(float* logits, int vocab) override {
    allowed_.assign(static_cast<size_t>(vocab), 0);
    bool any = false;
    const int n = std::min<int>(vocab, static_cast<int>(texts_->text.size()));
    for (int v = 0; v < n; ++v) {
      if (is_stop(v)) {
        allowed_[v] = state_.complete();
      } else if (!state_.complete() && !texts_->text[v].empty()) {
        State next = state_;
        allowed_[v] = next.feed(texts_->text[v]);
      }
      any = any || allowed_[v];
    }
    if (!any) return;  // nothing can follow (no stop token): sampling goes on unconstrained
    for (int v = 0; v < vocab; ++v)
      if (!allowed_[v]) logits[v] = -INFINITY;
  }

  void accept(int32_t token) override {
    if (is_stop(token) || token < 0 || static_cast<size_t>(token) >= texts_->text.size()) return;
    (void)state_.feed(texts_->text[static_cast<size_t>(token)]);
  }

 private:
  bool is_stop(int32_t v) const { return std::find(stops_.begin(), stops_.end(), v) != stops_.end(); }
  std::shared_ptr<const TokenTexts> texts_;
  std::vector<int32_t> stops_;
  std::shared_ptr<const JsonSchema> schema_;  // what a SchemaPrefix state points into
  State state_;
  std::vector<char> allowed_;
};

}  // namespace

std::shared_ptr<policy::TokenConstraint> json_object_constraint(std::shared_ptr<const TokenTexts> texts,
                                                                std::vector<int32_t> stops) {
  return std::make_shared<JsonConstraint<JsonPrefix>>(std::move(texts), std::move(stops), JsonPrefix());
}

std::shared_ptr<policy::TokenConstraint> json_schema_constraint(std::shared_ptr<const TokenTexts> texts,
                                                                std::shared_ptr<const JsonSchema> schema,
                                                                std::vector<int32_t> stops) {
  SchemaPrefix start(schema.get());
  return std::make_shared<JsonConstraint<SchemaPrefix>>(std::move(texts), std::move(stops), start, std::move(schema));
}

}  // namespace troupe::serve
