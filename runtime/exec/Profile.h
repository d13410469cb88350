// Internal to runtime/exec: the runtime profile (ExecutorOptions::profile),
// wall time per kernel op and per instruction kind, kept per stream so that
// streams never share a counter.
#ifndef PIPER_RUNTIME_EXEC_PROFILE_H
#define PIPER_RUNTIME_EXEC_PROFILE_H

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/exec/Executor.h"

namespace piper::runtime {

using Clock = std::chrono::steady_clock;

inline int64_t nanosSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() -
                                                              start)
      .count();
}

/// The profile table: rows are fixed executor rows, then one per
/// instruction kind, then one per registered kernel.
class Profiler {
public:
  enum FixedRow {
    kCallAlloc,
    kCallOther,
    kWaitSends,
    kLossAllReduce,
    kNumFixedRows
  };

  /// Sizes the table for `numStreams` streams.
  void init(int numStreams);
  int kindRow(int kind) const { return kindRow0 + kind; }
  /// The row of the kernel with KernelInfo::index `index`.
  int kernelRow(int index) const { return kernelRow0 + index; }
  /// Adds one call of `ns` nanoseconds to `row` of stream `s`; only the
  /// stream's own thread calls it.
  void add(int s, int row, int64_t ns) {
    Slot &slot = slots[s][row];
    ++slot.count;
    slot.nanos += ns;
  }
  /// Rows that ran, by decreasing time.
  std::vector<ProfileEntry> entries() const;
  void reset();

private:
  struct Slot {
    int64_t count = 0;
    int64_t nanos = 0;
  };
  std::vector<std::string> names;
  int kindRow0 = 0;
  int kernelRow0 = 0;
  std::vector<std::vector<Slot>> slots; // [stream][row]
};

} // namespace piper::runtime

#endif // PIPER_RUNTIME_EXEC_PROFILE_H
