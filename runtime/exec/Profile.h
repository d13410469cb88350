// Internal to runtime/exec: the runtime profile (ExecutorOptions::profile),
// wall time per kernel op and per instruction kind, kept per stream so that
// streams never share a counter; and the step tracer
// (ExecutorOptions::traceStep), the start and end of every instruction of
// one step.
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

/// steady_clock nanoseconds since its epoch (StepTrace's unit).
inline int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

/// Records the timeline of one step into a StepTrace allocated when the
/// executor is created: every stream writes only its own span vector, so
/// recording takes no lock and allocates nothing; other steps do nothing.
class StepTracer {
public:
  /// Sizes the spans for `plan`'s streams when `step` >= 1; otherwise the
  /// tracer stays off.
  void init(const plan::Plan &plan, int64_t step);
  /// Whether `step` is the one to record.
  bool traces(int64_t step) const { return step == tracedStep; }
  /// Clears the spans and records the step's start; before the streams run.
  void beginStep();
  /// The spans of stream `s` (indexed by instruction), written by its thread.
  StepTrace::Span *spans(int s) { return recorded.streams[s].data(); }
  /// Stream `s` has finished the step (its sends completed).
  void endStream(int s) { streamEnds[s] = steadyNowNs(); }
  /// Every stream has finished `step` without error: the trace is complete.
  void endStep(int64_t step);
  const StepTrace &trace() const { return recorded; }

private:
  int64_t tracedStep = -1;
  StepTrace recorded;
  std::vector<int64_t> streamEnds;
};

} // namespace piper::runtime

#endif // PIPER_RUNTIME_EXEC_PROFILE_H
