// Error values shared by every troupe library: libraries return Result<T>/Status, only launch/
// turns them into exit codes (ErrorCode::invalid_input -> 2, peer_failed -> 3, anything else -> 1).
// Messages name the thing at fault (file:line:col, tensor, peer) and, where possible, the fix.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace troupe {

enum class ErrorCode {
  invalid_input,  // bad config, bad file, bad message: the user can fix it (exit 2)
  peer_failed,    // a peer process, rank or actor died or stopped answering (exit 3)
  timeout,        // a call ran past its deadline
  io,             // the OS refused (disk, socket)
  internal,       // a bug in troupe
};

struct Error {
  ErrorCode code = ErrorCode::internal;
  std::string message;
};

inline int exit_code_for(ErrorCode c) {
  switch (c) {
    case ErrorCode::invalid_input: return 2;
    case ErrorCode::peer_failed: return 3;
    default: return 1;
  }
}

inline Error make_error(ErrorCode code, std::string message) { return Error{code, std::move(message)}; }
inline Error invalid_input(std::string message) { return Error{ErrorCode::invalid_input, std::move(message)}; }

// Result<T>: a value or an Error. Result<void> is spelled Status.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : e_(std::move(error)) {}  // NOLINT(google-explicit-constructor)
  static Status ok_status() { return {}; }
  bool ok() const { return !e_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return *e_; }

 private:
  std::optional<Error> e_;
};

}  // namespace troupe

// Propagate an error from an expression returning Status or Result<T>. The _WITH_ forms take the
// return keyword, so coroutines (runtime/coroutine.h: co_return) use the same definitions.
#define TROUPE_TRY(expr) TROUPE_TRY_WITH_(return, troupe_try_r_, expr)
#define TROUPE_TRY_WITH_(ret, tmp, expr) \
  do {                                   \
    auto&& tmp = (expr);                 \
    if (!tmp.ok()) ret tmp.error();      \
  } while (0)

#define TROUPE_CONCAT_INNER_(a, b) a##b
#define TROUPE_CONCAT_(a, b) TROUPE_CONCAT_INNER_(a, b)
// TROUPE_ASSIGN_OR_RETURN(auto x, make_x());
#define TROUPE_ASSIGN_OR_RETURN(lhs, expr) \
  TROUPE_ASSIGN_OR_RETURN_WITH_(return, TROUPE_CONCAT_(troupe_r_, __LINE__), lhs, expr)
#define TROUPE_ASSIGN_OR_RETURN_WITH_(ret, tmp, lhs, expr) \
  auto tmp = (expr);                                       \
  if (!tmp.ok()) ret tmp.error();                          \
  lhs = std::move(tmp).value()
