// C++20 coroutines for actor code: sequential logic (ask, await, ask again) without a blocking
// call on an actor thread. A Task<T> is started by a handler; request() sends at once and gives a
// Reply whose co_await suspends the task until the reply continuation resumes it -- on the actor's
// own thread, with that continuation's fresh Context made current in the actor's ActorContext.
//
//   Task<Status> step(ActorContext& here) {
//     auto a = request<Pong>(here, x, Ping{}, 1s);  // both sent now: x and y work in parallel
//     auto b = request<Pong>(here, y, Ping{}, 1s);
//     TROUPE_CO_ASSIGN_OR_RETURN(auto pa, co_await a);
//     TROUPE_CO_ASSIGN_OR_RETURN(auto pb, co_await b);
//     co_return {};
//   }
//
// Invariants: a coroutine runs only on its actor's thread, one piece at a time (a reply
// continuation, a handler, or Wakeup::notify_all called from one); a Task is lazy until start()
// or co_await; destroying a suspended Task abandons what it awaits (a later reply is dropped).
// Coroutine parameters outlive the first suspension only when passed by value (or when the caller
// awaits at once and owns the referent); lambdas with captures must not be coroutines.
// GCC 12: a braced aggregate temporary passed by value inside a co_await expression
// (`co_await request<Rep>(here, to, Req{"text"}, t)`) is destroyed wrongly (a short string in it
// is freed from the coroutine frame); send in a statement of its own and await the Reply after,
// as above (runtime.coroutine covers the pattern).
#pragma once

#include <algorithm>
#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/runtime/system.h"

// TROUPE_TRY / TROUPE_ASSIGN_OR_RETURN for coroutines (co_return instead of return).
#define TROUPE_CO_TRY(expr) TROUPE_TRY_WITH_(co_return, troupe_co_try_r_, expr)
#define TROUPE_CO_ASSIGN_OR_RETURN(lhs, expr) \
  TROUPE_ASSIGN_OR_RETURN_WITH_(co_return, TROUPE_CONCAT_(troupe_co_r_, __LINE__), lhs, expr)

namespace troupe::runtime {

// The Context of whatever is running an actor's coroutines now: the handler that started them,
// then the reply continuation that resumed them. One per actor; it must outlive its coroutines.
class ActorContext {
 public:
  Context& operator*() const { return *ctx_; }
  Context* operator->() const { return ctx_; }
  bool active() const { return ctx_ != nullptr; }

  // Makes `c` current while it lives, then restores the one before (resumptions may nest).
  class Scope {
   public:
    Scope(ActorContext& here, Context& c) : here_(here), prev_(here.ctx_) { here.ctx_ = &c; }
    ~Scope() { here_.ctx_ = prev_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ActorContext& here_;
    Context* prev_;
  };

 private:
  Context* ctx_ = nullptr;
};

// A coroutine that produces a T. co_await runs it (if not started) and gives its value; start()
// runs it up to its first suspension and lets it go on alone (await it later, or read result()).
// One awaiter at most.
template <class T>
class [[nodiscard]] Task {
 public:
  struct promise_type;
  using Handle = std::coroutine_handle<promise_type>;

  struct promise_type {
    std::optional<T> value;
    std::exception_ptr exception;
    std::coroutine_handle<> continuation;  // who awaits this task (none: nobody yet)
    bool started = false;

    Task get_return_object() { return Task(Handle::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(Handle h) noexcept {
        auto c = h.promise().continuation;
        return c ? c : std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    FinalAwaiter final_suspend() noexcept { return {}; }
    void return_value(T v) { value.emplace(std::move(v)); }
    void unhandled_exception() { exception = std::current_exception(); }
  };

  Task() = default;
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() { reset(); }

  bool valid() const { return static_cast<bool>(h_); }
  bool done() const { return h_ && h_.done(); }
  // Runs the task up to its first suspension; it goes on in the continuations that resume it.
  void start() {
    if (h_ && !h_.promise().started) {
      h_.promise().started = true;
      h_.resume();
    }
  }
  // The value of a finished task (done()); rethrows what escaped it.
  T& result() {
    if (h_.promise().exception) std::rethrow_exception(h_.promise().exception);
    return *h_.promise().value;
  }

  struct Awaiter {
    Handle h;
    bool await_ready() const noexcept { return h.done(); }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<> caller) noexcept {
      h.promise().continuation = caller;
      if (!h.promise().started) {  // lazy: run it now (symmetric transfer, no stack growth)
        h.promise().started = true;
        return h;
      }
      return std::noop_coroutine();  // running already: its end resumes the caller
    }
    T await_resume() {
      if (h.promise().exception) std::rethrow_exception(h.promise().exception);
      return std::move(*h.promise().value);
    }
  };
  Awaiter operator co_await() & noexcept { return Awaiter{h_}; }
  Awaiter operator co_await() && noexcept { return Awaiter{h_}; }

 private:
  explicit Task(Handle h) : h_(h) {}
  void reset() {
    if (h_) h_.destroy();
    h_ = {};
  }
  Handle h_;
};

// A request in flight (see request()): co_await gives its Result once, when the reply, an error
// reply, the timeout or the peer's failure has ended it. Dropping a Reply unawaited is fine (the
// result is dropped when it comes).
template <class Rep>
class [[nodiscard]] Reply {
 public:
  struct State {
    std::optional<Result<Rep>> result;
    std::coroutine_handle<> waiter;
    ActorContext* here = nullptr;
  };
  explicit Reply(std::shared_ptr<State> s) : st_(std::move(s)) {}
  Reply(Reply&&) noexcept = default;
  Reply& operator=(Reply&&) noexcept = default;
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;

  class Awaiter {
   public:
    explicit Awaiter(std::shared_ptr<State> s) : st_(std::move(s)) {}
    Awaiter(const Awaiter&) = delete;
    Awaiter& operator=(const Awaiter&) = delete;
    ~Awaiter() { st_->waiter = {}; }  // the awaiting frame is going away: a late reply resumes nothing
    bool await_ready() const noexcept { return st_->result.has_value(); }
    void await_suspend(std::coroutine_handle<> h) noexcept { st_->waiter = h; }
    Result<Rep> await_resume() { return std::move(*st_->result); }

   private:
    std::shared_ptr<State> st_;
  };
  // (a separate awaiter object: the compiler never needs to copy the Reply itself)
  Awaiter operator co_await() const noexcept { return Awaiter(st_); }

 private:
  std::shared_ptr<State> st_;
};

// Sends `req` now (Context::request on the current Context) and returns its Reply. `req` may be a
// std::shared_ptr<const Req>: the same request to many actors, local ones sharing the object.
template <class Rep, class ReqOrShared>
Reply<Rep> request(ActorContext& here, ActorId to, ReqOrShared req, Duration timeout) {
  auto st = std::make_shared<typename Reply<Rep>::State>();
  st->here = &here;
  here->template request<Rep>(to, std::move(req), timeout, [st](Context& c, Result<Rep> r) {
    st->result.emplace(std::move(r));
    if (auto h = std::exchange(st->waiter, {})) {
      ActorContext::Scope scope(*st->here, c);
      h.resume();
    }
  });
  return Reply<Rep>(std::move(st));
}

// Coroutines of one actor waiting for a change of its state: `while (!ready()) co_await w.wait();`,
// and whoever changes it calls notify_all() (on the actor's thread), which resumes every waiter
// in turn before it returns.
class Wakeup {
 public:
  class Awaiter {
   public:
    explicit Awaiter(Wakeup* w) : w_(w) {}
    Awaiter(const Awaiter&) = delete;
    Awaiter& operator=(const Awaiter&) = delete;
    ~Awaiter() { w_->forget(this); }
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) {
      h_ = h;
      w_->waiting_.push_back(this);
    }
    void await_resume() const noexcept {}

   private:
    friend class Wakeup;
    Wakeup* w_;
    std::coroutine_handle<> h_;
  };

  Awaiter wait() { return Awaiter(this); }
  void notify_all() {
    auto waiting = std::exchange(waiting_, {});
    for (Awaiter* a : waiting) std::exchange(a->h_, {}).resume();
  }
  bool has_waiters() const { return !waiting_.empty(); }

 private:
  void forget(Awaiter* a) {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), a), waiting_.end());
  }
  std::vector<Awaiter*> waiting_;
};

}  // namespace troupe::runtime
