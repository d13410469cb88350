// Small error-or-success types for the runtime: errors carry a message with
// context (rank, instruction, file) instead of aborting the process. Status
// is ok or an error; StatusOr<T> is a value or the error why there is none.
#ifndef PIPER_SUPPORT_STATUS_H
#define PIPER_SUPPORT_STATUS_H

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace piper {

/// The result of a runtime operation: ok, or an error with a message.
/// Messages are lowercase, without a trailing period.
class [[nodiscard]] Status {
public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) {
    Status s;
    s.failed = true;
    s.msg = std::move(message);
    return s;
  }
  /// An error that every rank reaches by itself at the same point, such as
  /// a non-finite global gradient norm (all-reduced, so the same on every
  /// rank): no peer failed, so nobody waits for a watchdog's verdict.
  static Status diverged(std::string message) {
    Status s = error(std::move(message));
    s.divergedError = true;
    return s;
  }
  bool isOk() const { return !failed; }
  explicit operator bool() const { return !failed; }
  const std::string &message() const { return msg; }
  bool isDiverged() const { return divergedError; }
  /// Returns this error with `context` prepended ("context: message").
  Status withContext(const std::string &context) const {
    if (!failed)
      return Status();
    Status s = error(context + ": " + msg);
    s.divergedError = divergedError;
    return s;
  }

private:
  bool failed = false;
  bool divergedError = false;
  std::string msg;
};

/// A value of type T, or the error why there is none. Built from a T or
/// from an error Status (so `return Status::error(...)` works in a function
/// returning StatusOr<T>); built from an ok Status, which has no value, it
/// holds an error saying so instead of an empty value. Read value() only
/// when isOk(); PIPER_ASSIGN_OR_RETURN does both.
template <typename T> class [[nodiscard]] StatusOr {
public:
  StatusOr(T value) : val(std::move(value)) {}
  StatusOr(Status error)
      : st(error.isOk() ? Status::error("internal error: a StatusOr built "
                                        "from an ok status has no value")
                        : std::move(error)) {}

  bool isOk() const { return val.has_value(); }
  explicit operator bool() const { return isOk(); }
  /// Ok when there is a value, else the error.
  const Status &status() const { return st; }

  const T &value() const & {
    assert(isOk());
    return *val;
  }
  T &value() & {
    assert(isOk());
    return *val;
  }
  T &&value() && {
    assert(isOk());
    return std::move(*val);
  }
  const T &operator*() const & { return value(); }
  const T *operator->() const { return &value(); }

  /// This value, or this error with `context` prepended.
  StatusOr withContext(const std::string &context) && {
    if (isOk())
      return std::move(*this);
    return st.withContext(context);
  }

private:
  Status st;
  std::optional<T> val;
};

} // namespace piper

#define PIPER_STATUS_CONCAT_(a, b) a##b
#define PIPER_STATUS_CONCAT(a, b) PIPER_STATUS_CONCAT_(a, b)

/// `lhs = value of expr` when `expr` (a StatusOr) holds one; otherwise
/// returns its error from the enclosing function. Expands to several
/// statements: use it in a braced block, not as the body of an unbraced
/// `if`. `lhs` may declare a variable (`PIPER_ASSIGN_OR_RETURN(int64_t n,
/// jsonInt(o, "n"))`).
#define PIPER_ASSIGN_OR_RETURN(lhs, expr)                                      \
  PIPER_ASSIGN_OR_RETURN_(PIPER_STATUS_CONCAT(piperOr_, __LINE__), lhs, expr)
#define PIPER_ASSIGN_OR_RETURN_(tmp, lhs, expr)                                \
  auto tmp = (expr);                                                           \
  if (!tmp.isOk())                                                             \
    return tmp.status();                                                       \
  lhs = std::move(tmp).value()

/// Returns from the enclosing function when `expr` yields an error status.
#define PIPER_RETURN_IF_ERROR(expr)                                            \
  do {                                                                         \
    ::piper::Status piperStatus_ = (expr);                                     \
    if (!piperStatus_.isOk())                                                  \
      return piperStatus_;                                                     \
  } while (0)

#endif // PIPER_SUPPORT_STATUS_H
