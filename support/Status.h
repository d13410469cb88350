// A small error-or-success type for the runtime: errors carry a message with
// context (rank, instruction, file) instead of aborting the process.
#ifndef PIPER_SUPPORT_STATUS_H
#define PIPER_SUPPORT_STATUS_H

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

} // namespace piper

/// Returns from the enclosing function when `expr` yields an error status.
#define PIPER_RETURN_IF_ERROR(expr)                                            \
  do {                                                                         \
    ::piper::Status piperStatus_ = (expr);                            \
    if (!piperStatus_.isOk())                                                  \
      return piperStatus_;                                                     \
  } while (0)

#endif // PIPER_SUPPORT_STATUS_H
