// response_format json_object and json_schema (json_constraint.h): the token mask built on
// SchemaPrefix (json_object: JsonSchema::any_object). Invariant: a token is allowed only if feeding
// its bytes to a copy of the state succeeds, so every completion is a prefix of one admitted
// document (whole once a stop token is drawn).
#include "troupe/serve/json_constraint.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

namespace troupe::serve {

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

class JsonConstraint : public policy::TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const TokenTexts> texts, std::shared_ptr<const JsonSchema> schema,
                 std::vector<int32_t> stops)
      : texts_(std::move(texts)), stops_(std::move(stops)), schema_(std::move(schema)), state_(schema_.get()) {}

  void mask(float* logits, int vocab) override {
    allowed_.assign(static_cast<size_t>(vocab), 0);
    bool any = false;
    const int n = std::min<int>(vocab, static_cast<int>(texts_->text.size()));
    for (int v = 0; v < n; ++v) {
      if (is_stop(v)) {
        allowed_[v] = state_.complete();
      } else if (!state_.complete() && !texts_->text[v].empty()) {
        SchemaPrefix next = state_;
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
  SchemaPrefix state_;
  std::vector<char> allowed_;
};

}  // namespace

std::shared_ptr<policy::TokenConstraint> json_object_constraint(std::shared_ptr<const TokenTexts> texts,
                                                                std::vector<int32_t> stops) {
  return std::make_shared<JsonConstraint>(std::move(texts), JsonSchema::any_object(), std::move(stops));
}

std::shared_ptr<policy::TokenConstraint> json_schema_constraint(std::shared_ptr<const TokenTexts> texts,
                                                                std::shared_ptr<const JsonSchema> schema,
                                                                std::vector<int32_t> stops) {
  return std::make_shared<JsonConstraint>(std::move(texts), std::move(schema), std::move(stops));
}

}  // namespace troupe::serve
