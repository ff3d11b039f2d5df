// The chat-template renderer (renderer.h): a tree walk over the parsed template with jinja2's
// scoping (a for body and a macro call get their own frame; a macro sees only its frame and the
// globals), loop.* variables, break/continue, and Python's operators on values.
// Invariant: the tree is only read; every value a render creates lives in the renderer's frames; a
// render nests at most kMaxDepth evaluations and spends at most kMaxSteps (an error past either).
#include "renderer.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "builtins.h"
#include "filters.h"

namespace troupe::policy::io::jinja {

namespace {

enum class Flow { normal, break_, continue_ };

// Bounds of one render: nesting (expressions, blocks, macro calls) and work (an evaluation or a
// statement is one step, building a string or list one more per 64 bytes or items).
constexpr int kMaxDepth = 200;
constexpr uint64_t kMaxSteps = 1'000'000;

class Renderer {
 public:
  explicit Renderer(Object globals) { scopes_.push_back(std::move(globals)); }

  // One level deeper for as long as it lives; each one is a step of the budget.
  class Nest {
   public:
    Nest(Renderer& r, int line, int col) : r_(r) {
      if (++r_.depth_ > kMaxDepth) fail(line, col, "the template nests deeper than " + std::to_string(kMaxDepth) + " levels");
      r_.charge(1, line, col);
    }
    ~Nest() { --r_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Renderer& r_;
  };
  void charge(uint64_t steps, int line, int col) {
    steps_ += steps;
    if (steps_ > kMaxSteps) fail(line, col, "the template takes more than " + std::to_string(kMaxSteps) + " steps to render");
  }
  // A value just built: strings and lists cost by their size.
  Value charged(Value v, const Expr& e) {
    if (v.t == T::string) charge(v.s.size() / 64, e.line, e.col);
    else if (v.t == T::array) charge(v.a->size() / 64, e.line, e.col);
    return v;
  }

  void push() { scopes_.emplace_back(); }
  void pop() { scopes_.pop_back(); }
  void set(const std::string& name, Value v) {
    Object& s = scopes_.back();
    for (auto& [k, old] : s)
      if (k == name) { old = std::move(v); return; }
    s.emplace_back(name, std::move(v));
  }
  Value lookup(const std::string& name) const {
    for (size_t k = scopes_.size(); k-- > 0;) {
      if (k < base_ && k > 1) continue;  // a macro sees its own frame and the template's globals only
      for (auto& [n, v] : scopes_[k])
        if (n == name) return v;
    }
    return {};
  }

  Flow render(const Body& body, std::string& out) {
    for (auto& n : body) {
      Flow f = render(*n, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

 private:
  std::vector<Object> scopes_;
  size_t base_ = 0;
  int depth_ = 0;
  uint64_t steps_ = 0;

  void append(std::string& out, const std::string& text, const Node& n) {
    charge(text.size() / 64, n.line, n.col);
    if (out.size() + text.size() > kMaxStringBytes)
      fail(n.line, n.col, "the output is longer than " + std::to_string(kMaxStringBytes) + " bytes");
    out += text;
  }

  Flow render(const Node& n, std::string& out) {
    Nest nest(*this, n.line, n.col);
    switch (n.k) {
      case Node::K::text: append(out, n.text, n); return Flow::normal;
      case Node::K::output: append(out, py_str(eval(*n.exprs[0])), n); return Flow::normal;
      case Node::K::body: return render(n.body, out);
      case Node::K::break_: return Flow::break_;
      case Node::K::continue_: return Flow::continue_;
      case Node::K::if_:
        for (auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond))) return render(body, out);
        return Flow::normal;
      case Node::K::set: {
        Value v = eval(*n.exprs[0]);
        if (n.attr.empty()) {
          set(n.text, std::move(v));
        } else {
          Value target = lookup(n.text);
          if (target.t != T::object || !target.is_namespace)
            fail(n.line, n.col, "cannot assign attribute '" + n.attr + "' of '" + n.text + "': not a namespace()");
          if (holds_namespace(v))
            fail(n.line, n.col, "cannot assign a namespace() (or what holds one) to '" + n.text + "." + n.attr + "'");
          target.put(n.attr, std::move(v));
        }
        return Flow::normal;
      }
      case Node::K::set_block: {
        std::string captured;
        render(n.body, captured);
        set(n.text, Value::string(captured));
        return Flow::normal;
      }
      case Node::K::macro: {
        auto node = &n;  // the AST outlives the render
        set(n.text, Value::function([this, node](const Args& args, const Kwargs& kwargs) {
              return call_macro(*node, args, kwargs);
            }));
        return Flow::normal;
      }
      case Node::K::for_: return render_for(n, out);
    }
    return Flow::normal;
  }

  Value call_macro(const Node& m, const Args& args, const Kwargs& kwargs) {
    Nest nest(*this, m.line, m.col);
    if (args.size() > m.vars.size()) fail(m.line, m.col, "macro '" + m.text + "' called with too many arguments");
    size_t saved_base = base_;
    push();
    base_ = scopes_.size() - 1;
    for (size_t k = 0; k < m.vars.size(); ++k) {
      Value v;
      if (k < args.size()) v = args[k];
      else if (m.exprs[k]) v = eval(*m.exprs[k]);
      for (auto& [name, kv] : kwargs)
        if (name == m.vars[k]) v = kv;
      set(m.vars[k], v);
    }
    std::string out;
    render(m.body, out);
    pop();
    base_ = saved_base;
    return Value::string(out);
  }


  Flow render_for(const Node& n, std::string& out) {
    std::vector<Value> items = iterate(eval(*n.exprs[0]), *n.exprs[0]);
    auto bind = [&](const Value& item) {
      if (n.vars.size() == 1) { set(n.vars[0], item); return; }
      if (item.t != T::array || item.a->size() != n.vars.size())
        fail(n.line, n.col, "cannot unpack a " + std::string(type_name(item)) + " into " + std::to_string(n.vars.size()) + " loop variables");
      for (size_t k = 0; k < n.vars.size(); ++k) set(n.vars[k], (*item.a)[k]);
    };
    push();
    if (n.exprs.size() > 1) {  // `for x in xs if cond`: filter first, loop.* counts what remains
      std::vector<Value> kept;
      for (auto& it : items) {
        bind(it);
        if (truthy(eval(*n.exprs[1]))) kept.push_back(it);
      }
      items = std::move(kept);
    }
    pop();
    if (items.empty()) return render(n.else_body, out);
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      charge(1, n.line, n.col);  // an iteration is a step even when its body is empty
      push();
      bind(items[static_cast<size_t>(k)]);
      Object loop = {{"index0", Value::integer(k)},
                     {"index", Value::integer(k + 1)},
                     {"revindex0", Value::integer(len - k - 1)},
                     {"revindex", Value::integer(len - k)},
                     {"first", Value::boolean(k == 0)},
                     {"last", Value::boolean(k == len - 1)},
                     {"length", Value::integer(len)},
                     {"previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value{}},
                     {"nextitem", k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value{}}};
      set("loop", Value::object(std::move(loop)));
      Flow f = render(n.body, out);
      pop();
      if (f == Flow::break_) break;
    }
    return Flow::normal;
  }

  // -- expressions
  Value eval(const Expr& e) {
    Nest nest(*this, e.line, e.col);
    switch (e.k) {
      case Expr::K::literal: return e.literal;
      case Expr::K::name: return lookup(e.name);
      case Expr::K::list: {
        Array a;
        for (auto& x : e.args) a.push_back(eval(*x));
        return Value::array(std::move(a));
      }
      case Expr::K::dict: {
        Value o = Value::object();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (!key.is_str()) err(*e.args[k], "dict keys must be strings");
          o.put(key.s, eval(*e.args[k + 1]));
        }
        return o;
      }
      case Expr::K::attr: return get_attr(eval(*e.args[0]), e.name, e);
      case Expr::K::item: return get_item(eval(*e.args[0]), eval(*e.args[1]), e);
      case Expr::K::slice: return slice(e);
      case Expr::K::cond: return truthy(eval(*e.args[0])) ? eval(*e.args[1]) : eval(*e.args[2]);
      case Expr::K::unary: {
        Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (!v.is_num()) err(e, std::string("bad operand for unary ") + e.name + ": " + type_name(v));
        if (e.name == "+") return v;
        if (v.t == T::integer && v.i == INT64_MIN) err(e, "integer overflow in unary -");
        return v.t == T::integer ? Value::integer(-v.i) : Value::number(-v.d);
      }
      case Expr::K::binary: return charged(binary(e), e);
      case Expr::K::call: return charged(call(e), e);
      case Expr::K::filter: return charged(filter(e), e);
      case Expr::K::test: return test(e);
    }
    return {};
  }

  Value slice(const Expr& e) {
    Value v = eval(*e.args[0]);
    std::vector<Value> items;
    if (v.t == T::array) items = *v.a;
    else if (v.t == T::string) for (auto& c : utf8_chars(v.s)) items.push_back(Value::string(c));
    else err(e, std::string("cannot slice a ") + type_name(v));
    auto get = [&](size_t k) -> std::optional<int64_t> {
      if (!e.args[k]) return std::nullopt;
      Value x = eval(*e.args[k]);
      if (x.t == T::none) return std::nullopt;
      if (x.t != T::integer) err(e, "slice indices must be integers");
      return x.i;
    };
    auto n = static_cast<int64_t>(items.size());
    int64_t step = get(3).value_or(1);
    if (step == 0) err(e, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
      if (!x) return dflt;
      int64_t k = *x < 0 ? *x + n : *x;
      if (step > 0) return std::clamp<int64_t>(k, 0, n);
      return std::clamp<int64_t>(k, -1, n - 1);
    };
    int64_t start = clamp(get(1), step > 0 ? 0 : n - 1), stop = clamp(get(2), step > 0 ? n : -1);
    std::vector<Value> out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
      out.push_back(items[static_cast<size_t>(k)]);
      if (__builtin_add_overflow(k, step, &k)) break;  // past either end
    }
    if (v.t == T::array) return Value::array(std::move(out));
    std::string s;
    for (auto& c : out) s += c.s;
    return Value::string(s);
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.args[0]);
      return truthy(l) ? eval(*e.args[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*e.args[0]);
      return truthy(l) ? l : eval(*e.args[1]);
    }
    Value l = eval(*e.args[0]), r = eval(*e.args[1]);
    if (op == "~") return Value::string(py_str(l) + py_str(r));
    if (op == "==") return Value::boolean(equal(l, r));
    if (op == "!=") return Value::boolean(!equal(l, r));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.t == T::string && l.t == T::string) found = r.s.find(l.s) != std::string::npos;
      else if (r.t == T::array) found = std::any_of(r.a->begin(), r.a->end(), [&](const Value& x) { return equal(x, l); });
      else if (r.t == T::object) found = l.is_str() && r.find(l.s) != nullptr;
      else if (r.t == T::undefined) err(e, "'in' on an undefined value");
      else err(e, std::string("'in' needs a string, list or mapping on the right, got ") + type_name(r));
      return Value::boolean(op == "in" ? found : !found);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (l.is_num() && r.is_num()) c = l.as_double() < r.as_double() ? -1 : l.as_double() > r.as_double() ? 1 : 0;
      else if (l.is_str() && r.is_str()) c = l.s.compare(r.s) < 0 ? -1 : l.s == r.s ? 0 : 1;
      else err(e, std::string("cannot compare ") + type_name(l) + " and " + type_name(r));
      bool res = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
      return Value::boolean(res);
    }
    if (op == "+") {
      if (l.is_str() && r.is_str()) return Value::string(l.s + r.s);
      if (l.t == T::array && r.t == T::array) {
        Array a = *l.a;
        a.insert(a.end(), r.a->begin(), r.a->end());
        return Value::array(std::move(a));
      }
    }
    if (op == "*" && l.is_str() && r.t == T::integer) {
      if (r.i > 0 && l.s.size() > kMaxStringBytes / static_cast<uint64_t>(r.i))
        err(e, "a string longer than " + std::to_string(kMaxStringBytes) + " bytes");
      std::string s;
      if (r.i > 0) s.reserve(l.s.size() * static_cast<uint64_t>(r.i));
      for (int64_t k = 0; k < r.i; ++k) s += l.s;
      return Value::string(s);
    }
    auto num = [&](const Value& v) {
      if (v.t == T::boolean) return Value::integer(v.b);
      if (!v.is_num()) err(e, "unsupported operand types for " + op + ": " + type_name(l) + " and " + type_name(r));
      return v;
    };
    Value a = num(l), b = num(r);
    if (a.t == T::integer && b.t == T::integer) return int_binary(op, a.i, b.i, e);
    if (op == "+") return Value::number(a.as_double() + b.as_double());
    if (op == "-") return Value::number(a.as_double() - b.as_double());
    if (op == "*") return Value::number(a.as_double() * b.as_double());
    if (op == "**") return Value::number(std::pow(a.as_double(), b.as_double()));
    if (b.as_double() == 0) err(e, "division by zero");
    if (op == "/") return Value::number(a.as_double() / b.as_double());
    if (op == "//") return Value::number(std::floor(a.as_double() / b.as_double()));
    return Value::number(a.as_double() - b.as_double() * std::floor(a.as_double() / b.as_double()));
  }

  // Python's integer operators; a result int64 cannot hold is an error (Python's would grow).
  static Value int_binary(const std::string& op, int64_t a, int64_t b, const Expr& e) {
    int64_t r = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(a, b, &r);
    else if (op == "-") overflow = __builtin_sub_overflow(a, b, &r);
    else if (op == "*") overflow = __builtin_mul_overflow(a, b, &r);
    else if (op == "**" && b >= 0) {  // by squaring: at most 64 rounds whatever b is
      r = 1;
      int64_t base = a;
      for (uint64_t n = static_cast<uint64_t>(b); n > 0 && !overflow; n >>= 1) {
        if ((n & 1) != 0) overflow = __builtin_mul_overflow(r, base, &r);
        if (n > 1 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
      }
    } else if (op == "**") {
      return Value::number(std::pow(static_cast<double>(a), static_cast<double>(b)));
    } else {
      if (b == 0) err(e, "division by zero");
      if (op == "/") return Value::number(static_cast<double>(a) / static_cast<double>(b));
      if (b == -1) {  // the one quotient that can overflow; any remainder is 0
        overflow = op == "//" && a == INT64_MIN;
        r = op == "//" && !overflow ? -a : 0;
      } else if (op == "//") {
        r = a / b - ((a % b != 0) && ((a < 0) != (b < 0)));  // floor, not truncation
      } else {
        r = a % b;
        if (r != 0 && ((r < 0) != (b < 0))) r += b;  // the sign of the divisor
      }
    }
    if (overflow) err(e, "integer overflow in " + std::to_string(a) + " " + op + " " + std::to_string(b));
    return Value::integer(r);
  }

  void eval_args(const Expr& e, size_t from, Args& args, Kwargs& kwargs) {
    for (size_t k = from; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    for (auto& [name, x] : e.kwargs) kwargs.emplace_back(name, eval(*x));
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    Args args;
    Kwargs kwargs;
    if (callee.k == Expr::K::attr) {
      Value self = eval(*callee.args[0]);
      eval_args(e, 1, args, kwargs);
      if (self.t == T::string || (self.t == T::object && !self.find(callee.name)))
        return call_method(self, callee.name, args, kwargs, e);
      Value fn = get_attr(self, callee.name, callee);
      if (fn.t != T::function) err(e, "'" + callee.name + "' is not callable");
      return (*fn.f)(args, kwargs);
    }
    Value fn = eval(callee);
    eval_args(e, 1, args, kwargs);
    if (fn.t != T::function) {
      std::string what = callee.k == Expr::K::name ? "'" + callee.name + "'" : "the value";
      err(e, what + (fn.defined() ? " is not callable" : " is undefined (unsupported function)"));
    }
    try {
      return (*fn.f)(args, kwargs);
    } catch (TemplateError& t) {
      if (t.line == 0) t.line = e.line, t.col = e.col;
      throw;
    }
  }

  // `subject | name(args)`: the subject first, then the arguments, then the filter.
  Value filter(const Expr& e) {
    Value v = eval(*e.args[0]);
    Args a;
    Kwargs kw;
    eval_args(e, 1, a, kw);
    return apply_filter(e.name, v, a, kw, e);
  }

  // `subject is [not] name(args)`, evaluated in the same order.
  Value test(const Expr& e) {
    Value v = eval(*e.args[0]);
    Args a;
    Kwargs kw;
    eval_args(e, 1, a, kw);
    bool r = apply_test(e.name, v, a, kw, e);
    return Value::boolean(e.negated ? !r : r);
  }
};

}  // namespace

std::string render_template(const Body& body, const nlohmann::ordered_json& variables) {
  Renderer r(make_globals());
  r.push();
  for (auto it = variables.begin(); it != variables.end(); ++it) r.set(it.key(), from_json(it.value()));
  std::string out;
  r.render(body, out);
  return out;
}

}  // namespace troupe::policy::io::jinja
