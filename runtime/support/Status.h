// A small error-or-success type for the runtime: errors carry a message with
// context (rank, instruction, file) instead of aborting the process.
#ifndef PIPER_RUNTIME_SUPPORT_STATUS_H
#define PIPER_RUNTIME_SUPPORT_STATUS_H

#include <string>
#include <utility>

namespace piper::runtime {

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
  bool isOk() const { return !failed; }
  explicit operator bool() const { return !failed; }
  const std::string &message() const { return msg; }
  /// Returns this error with `context` prepended ("context: message").
  Status withContext(const std::string &context) const {
    return failed ? error(context + ": " + msg) : Status();
  }

private:
  bool failed = false;
  std::string msg;
};

} // namespace piper::runtime

/// Returns from the enclosing function when `expr` yields an error status.
#define PIPER_RETURN_IF_ERROR(expr)                                            \
  do {                                                                         \
    ::piper::runtime::Status piperStatus_ = (expr);                            \
    if (!piperStatus_.isOk())                                                  \
      return piperStatus_;                                                     \
  } while (0)

#endif // PIPER_RUNTIME_SUPPORT_STATUS_H
