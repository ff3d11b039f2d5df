// The chat-template parser (parser.h): statements ({% if/for/set/macro/break/continue/generation %})
// and expressions in jinja2's precedence, names of filters and tests checked against the built-ins.
// Invariant: a parse either returns a whole tree or throws TemplateError at the offending token; the
// tree nests at most kMaxNesting blocks or parenthesized/unary levels, a tag holds at most kMaxTagTokens.
#include "parser.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "builtins.h"
#include "filters.h"
#include "lexer.h"

namespace troupe::policy::io::jinja {

namespace {

constexpr int kMaxNesting = 100;
constexpr size_t kMaxTagTokens = 4096;

class Parser {
 public:
  Parser(const Source& src, std::vector<Piece> pieces) : src_(src), pieces_(std::move(pieces)) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, end);
    return b;
  }

 private:
  const Source& src_;
  std::vector<Piece> pieces_;
  size_t pi_ = 0;
  std::vector<Tok> toks_;
  size_t ti_ = 0;
  int nesting_ = 0;

  // One level deeper (a block, a parenthesized or unary operand) for as long as it lives.
  class Nest {
   public:
    Nest(Parser& p, size_t offset) : p_(p) {
      if (++p_.nesting_ > kMaxNesting)
        p_.src_.fail_at(offset, "nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~Nest() { --p_.nesting_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };

  // -- statements
  Body parse_body(const std::set<std::string>& ends, std::string& end_kw) {
    Nest nest(*this, pi_ < pieces_.size() ? pieces_[pi_].offset : src_.text.size());
    Body body;
    while (pi_ < pieces_.size()) {
      const Piece& p = pieces_[pi_++];
      if (p.k == Piece::K::text) {
        if (p.body.empty()) continue;
        auto n = std::make_shared<Node>();
        n->k = Node::K::text;
        n->text = p.body;
        body.push_back(n);
        continue;
      }
      toks_ = tokenize(src_, p.body, p.offset);
      ti_ = 0;
      if (toks_.size() > kMaxTagTokens)
        src_.fail_at(p.offset, "a tag of more than " + std::to_string(kMaxTagTokens) + " tokens");
      if (p.k == Piece::K::expr) {
        auto n = make(Node::K::output, peek());
        n->exprs.push_back(parse_expr());
        expect_end();
        body.push_back(n);
        continue;
      }
      const Tok& kw = peek();
      if (kw.k != Tok::K::name) src_.fail_at(kw.offset, "expected a statement name after '{%'");
      if (ends.count(kw.s)) {
        end_kw = kw.s;
        return body;
      }
      body.push_back(parse_statement());
    }
    if (!ends.empty()) src_.fail_at(src_.text.size(), "unexpected end of template: missing {% " + *ends.rbegin() + " %}");
    return body;
  }

  std::shared_ptr<Node> make(Node::K k, const Tok& at) {
    auto n = std::make_shared<Node>();
    n->k = k;
    std::tie(n->line, n->col) = src_.pos(at.offset);
    return n;
  }

  NodeP parse_statement() {
    Tok kw = next();
    if (kw.s == "if") return parse_if(kw);
    if (kw.s == "for") return parse_for(kw);
    if (kw.s == "set") return parse_set(kw);
    if (kw.s == "macro") return parse_macro(kw);
    if (kw.s == "break" || kw.s == "continue") {
      auto n = make(kw.s == "break" ? Node::K::break_ : Node::K::continue_, kw);
      expect_end();
      return n;
    }
    if (kw.s == "generation") {  // transformers' assistant-mask marker: renders its body unchanged
      auto n = make(Node::K::body, kw);
      expect_end();
      n->body = parse_block("endgeneration");
      return n;
    }
    src_.fail_at(kw.offset, "unsupported statement '{% " + kw.s + " %}'");
  }

  // The body up to {% end_kw %}, which is consumed.
  Body parse_block(const std::string& end_kw) {
    std::string end;
    Body b = parse_body({end_kw}, end);
    next();
    expect_end();
    return b;
  }

  NodeP parse_if(const Tok& kw) {
    auto n = make(Node::K::if_, kw);
    ExprP cond = parse_expr();
    expect_end();
    for (;;) {
      std::string end;
      Body b = parse_body({"elif", "else", "endif"}, end);
      n->branches.emplace_back(cond, std::move(b));
      next();
      if (end == "endif") { expect_end(); break; }
      if (end == "else") {
        expect_end();
        n->branches.emplace_back(nullptr, parse_block("endif"));
        break;
      }
      cond = parse_expr();
      expect_end();
    }
    return n;
  }

  NodeP parse_for(const Tok& kw) {
    auto n = make(Node::K::for_, kw);
    do {
      n->vars.push_back(expect_name());
    } while (accept(","));
    if (!accept_name("in")) src_.fail_at(peek().offset, "expected 'in' in for loop");
    n->exprs.push_back(parse_expr(false));
    if (accept_name("if")) n->exprs.push_back(parse_expr(false));
    if (peek().k == Tok::K::name && peek().s == "recursive") src_.fail_at(peek().offset, "unsupported: recursive for loops");
    expect_end();
    std::string end;
    n->body = parse_body({"else", "endfor"}, end);
    next();
    expect_end();
    if (end == "else") n->else_body = parse_block("endfor");
    return n;
  }

  NodeP parse_set(const Tok& kw) {
    std::string name = expect_name();
    std::string attr;
    if (accept(".")) attr = expect_name();
    if (peek().k == Tok::K::op && peek().s == ",") src_.fail_at(peek().offset, "unsupported: tuple assignment in set");
    if (accept("=")) {
      auto n = make(Node::K::set, kw);
      n->text = name;
      n->attr = attr;
      n->exprs.push_back(parse_expr());
      expect_end();
      return n;
    }
    if (!attr.empty()) src_.fail_at(peek().offset, "expected '=' after set target");
    expect_end();
    auto n = make(Node::K::set_block, kw);
    n->text = name;
    n->body = parse_block("endset");
    return n;
  }

  NodeP parse_macro(const Tok& kw) {
    auto n = make(Node::K::macro, kw);
    n->text = expect_name();
    expect("(");
    while (!accept(")")) {
      n->vars.push_back(expect_name());
      n->exprs.push_back(accept("=") ? parse_expr() : nullptr);
      if (!accept(",")) { expect(")"); break; }
    }
    expect_end();
    n->body = parse_block("endmacro");
    return n;
  }

  // -- tokens
  const Tok& peek(size_t ahead = 0) const { return toks_[std::min(ti_ + ahead, toks_.size() - 1)]; }
  Tok next() { return toks_[std::min(ti_++, toks_.size() - 1)]; }
  bool is_op(const std::string& op, size_t ahead = 0) const {
    return peek(ahead).k == Tok::K::op && peek(ahead).s == op;
  }
  bool is_name(const std::string& n, size_t ahead = 0) const {
    return peek(ahead).k == Tok::K::name && peek(ahead).s == n;
  }
  bool accept(const std::string& op) {
    if (!is_op(op)) return false;
    ++ti_;
    return true;
  }
  bool accept_name(const std::string& n) {
    if (!is_name(n)) return false;
    ++ti_;
    return true;
  }
  void expect(const std::string& op) {
    if (!accept(op)) src_.fail_at(peek().offset, "expected '" + op + "', got '" + describe(peek()) + "'");
  }
  std::string expect_name() {
    if (peek().k != Tok::K::name) src_.fail_at(peek().offset, "expected a name, got '" + describe(peek()) + "'");
    return next().s;
  }
  void expect_end() {
    if (peek().k != Tok::K::end) src_.fail_at(peek().offset, "unexpected '" + describe(peek()) + "'");
  }
  static std::string describe(const Tok& t) { return t.k == Tok::K::end ? "end of tag" : t.s; }

  std::shared_ptr<Expr> make_expr(Expr::K k, size_t offset) {
    auto e = std::make_shared<Expr>();
    e->k = k;
    std::tie(e->line, e->col) = src_.pos(offset);
    return e;
  }
  ExprP binary(const std::string& op, ExprP l, ExprP r, size_t offset) {
    auto e = make_expr(Expr::K::binary, offset);
    e->name = op;
    e->args = {std::move(l), std::move(r)};
    return e;
  }

  // -- expressions (jinja2's precedence)
  ExprP parse_expr(bool with_cond = true) {
    size_t at = peek().offset;
    Nest nest(*this, at);
    ExprP e = parse_or();
    while (with_cond && is_name("if")) {
      next();
      auto c = make_expr(Expr::K::cond, at);
      ExprP test = parse_or();
      ExprP otherwise;
      if (accept_name("else")) otherwise = parse_expr();
      else otherwise = make_expr(Expr::K::literal, at);
      c->args = {test, e, otherwise};
      e = c;
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) { size_t at = next().offset; e = binary("or", e, parse_and(), at); }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) { size_t at = next().offset; e = binary("and", e, parse_not(), at); }
    return e;
  }
  ExprP parse_not() {
    Nest nest(*this, peek().offset);
    if (is_name("not")) {
      auto e = make_expr(Expr::K::unary, next().offset);
      e->name = "not";
      e->args = {parse_not()};
      return e;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    for (;;) {
      size_t at = peek().offset;
      if (peek().k == Tok::K::op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                     peek().s == "<=" || peek().s == ">=")) {
        std::string op = next().s;
        e = binary(op, e, parse_math1(), at);
      } else if (is_name("in")) {
        next();
        e = binary("in", e, parse_math1(), at);
      } else if (is_name("not") && is_name("in", 1)) {
        next(), next();
        e = binary("not in", e, parse_math1(), at);
      } else {
        return e;
      }
    }
  }
  // Left-associative binary operators `ops` over operands parsed by `operand`.
  ExprP left_assoc(std::initializer_list<const char*> ops, ExprP (Parser::*operand)()) {
    ExprP e = (this->*operand)();
    for (;;) {
      const char* hit = nullptr;
      for (const char* op : ops)
        if (is_op(op)) hit = op;
      if (!hit) return e;
      size_t at = next().offset;
      e = binary(hit, e, (this->*operand)(), at);
    }
  }
  ExprP parse_math1() { return left_assoc({"+", "-"}, &Parser::parse_concat); }
  ExprP parse_concat() { return left_assoc({"~"}, &Parser::parse_math2); }
  ExprP parse_math2() { return left_assoc({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprP parse_pow() { return left_assoc({"**"}, &Parser::parse_unary_filtered); }
  ExprP parse_unary_filtered() { return parse_unary(true); }
  ExprP parse_unary(bool with_filter = true) {
    Nest nest(*this, peek().offset);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      Tok op = next();
      auto u = make_expr(Expr::K::unary, op.offset);
      u->name = op.s;
      u->args = {parse_unary(false)};
      e = u;
    } else {
      e = parse_primary();
    }
    e = parse_postfix(e);
    if (with_filter) e = parse_filter_expr(e);
    return e;
  }
  ExprP parse_primary() {
    Tok t = next();
    if (t.k == Tok::K::name) {
      auto e = make_expr(Expr::K::literal, t.offset);
      if (t.s == "true" || t.s == "True") e->literal = Value::boolean(true);
      else if (t.s == "false" || t.s == "False") e->literal = Value::boolean(false);
      else if (t.s == "none" || t.s == "None") e->literal = Value::none();
      else e->k = Expr::K::name, e->name = t.s;
      return e;
    }
    if (t.k == Tok::K::str) {
      auto e = make_expr(Expr::K::literal, t.offset);
      std::string s = t.s;
      while (peek().k == Tok::K::str) s += next().s;
      e->literal = Value::string(s);
      return e;
    }
    if (t.k == Tok::K::integer || t.k == Tok::K::number) {
      auto e = make_expr(Expr::K::literal, t.offset);
      e->literal = t.k == Tok::K::integer ? Value::integer(t.i) : Value::number(t.d);
      return e;
    }
    if (t.k == Tok::K::op && t.s == "(") {
      ExprP inner = parse_expr();
      if (is_op(",")) src_.fail_at(peek().offset, "unsupported: tuples");
      expect(")");
      return inner;
    }
    if (t.k == Tok::K::op && t.s == "[") {
      auto e = make_expr(Expr::K::list, t.offset);
      while (!accept("]")) {
        e->args.push_back(parse_expr());
        if (!accept(",")) { expect("]"); break; }
      }
      return e;
    }
    if (t.k == Tok::K::op && t.s == "{") {
      auto e = make_expr(Expr::K::dict, t.offset);
      while (!accept("}")) {
        e->args.push_back(parse_expr());
        expect(":");
        e->args.push_back(parse_expr());
        if (!accept(",")) { expect("}"); break; }
      }
      return e;
    }
    src_.fail_at(t.offset, "unexpected '" + describe(t) + "'");
  }
  void parse_call_args(Expr& e) {
    while (!accept(")")) {
      if (peek().k == Tok::K::name && is_op("=", 1)) {
        std::string k = next().s;
        next();
        e.kwargs.emplace_back(k, parse_expr());
      } else {
        if (is_op("*") || is_op("**")) src_.fail_at(peek().offset, "unsupported: *args / **kwargs in calls");
        e.args.push_back(parse_expr());
      }
      if (!accept(",")) { expect(")"); break; }
    }
  }
  // callee(args): the next token is the '('.
  ExprP parse_call(ExprP callee) {
    auto c = make_expr(Expr::K::call, next().offset);
    c->args.push_back(std::move(callee));
    parse_call_args(*c);
    return c;
  }
  ExprP parse_postfix(ExprP e) {
    for (;;) {
      if (is_op(".")) {
        size_t at = next().offset;
        auto a = make_expr(Expr::K::attr, at);
        if (peek().k == Tok::K::integer) {
          a->k = Expr::K::item;
          auto idx = make_expr(Expr::K::literal, at);
          idx->literal = Value::integer(next().i);
          a->args = {e, idx};
        } else {
          a->name = expect_name();
          a->args = {e};
        }
        e = a;
      } else if (is_op("[")) {
        size_t at = next().offset;
        ExprP parts[3];
        bool is_slice = false;
        int part = 0;
        while (!is_op("]")) {
          if (accept(":")) {
            is_slice = true;
            if (++part > 2) src_.fail_at(at, "bad slice");
            continue;
          }
          if (parts[part]) src_.fail_at(peek().offset, "expected ']' or ':'");
          parts[part] = parse_expr();
        }
        expect("]");
        auto x = make_expr(is_slice ? Expr::K::slice : Expr::K::item, at);
        x->args = {e, parts[0], parts[1], parts[2]};
        if (!is_slice && !parts[0]) src_.fail_at(at, "empty subscript");
        if (!is_slice) x->args.resize(2);
        e = x;
      } else if (is_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }
  ExprP parse_filter_expr(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        next();
        auto f = make_expr(Expr::K::filter, peek().offset);
        size_t name_at = peek().offset;
        f->name = expect_name();
        if (!is_filter(f->name)) src_.fail_at(name_at, "unsupported filter '" + f->name + "'");
        f->args.push_back(e);
        if (accept("(")) parse_call_args(*f);
        e = f;
      } else if (is_name("is")) {
        next();
        auto t = make_expr(Expr::K::test, peek().offset);
        t->negated = accept_name("not");
        size_t name_at = peek().offset;
        t->name = expect_name();
        if (!is_test(t->name)) src_.fail_at(name_at, "unsupported test 'is " + t->name + "'");
        t->args.push_back(e);
        if (accept("(")) {
          parse_call_args(*t);
        } else if (peek().k == Tok::K::str || peek().k == Tok::K::integer || peek().k == Tok::K::number ||
                   (peek().k == Tok::K::name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is"))) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = t;
      } else if (is_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }
};

}  // namespace

Body parse_template(std::string_view source) {
  Source src(source);
  Parser p(src, lex(src));
  return p.parse_all();
}

}  // namespace troupe::policy::io::jinja
