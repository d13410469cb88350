// What a rank reports while it trains: the --metrics JSON lines, the
// --profile table and the peak-memory summary (progress lines: Progress.h).
#ifndef PIPER_RUNTIME_LAUNCH_RANK_REPORTING_H
#define PIPER_RUNTIME_LAUNCH_RANK_REPORTING_H

#include <cstdint>
#include <cstdio>
#include <string>

#include "runtime/exec/Executor.h"
#include "support/Status.h"

namespace piper::runtime {

/// The measurements of one training step, as rank 0 reports them.
struct StepReport {
  int64_t step = 0;
  /// The global loss; not finite when training diverged.
  double loss = 0;
  double tokensPerS = 0;
  double stepSeconds = 0;
  /// The learning rate the step used.
  double lr = 0;
  /// The global gradient norm before clipping; negative when not measured.
  double gradNorm = -1;
  int64_t peakBytes = 0;
  int64_t maxRssBytes = 0;
};

/// The process's peak resident set size (getrusage), in bytes.
int64_t maxRssBytes();

/// The --metrics line of a step (docs/piper-run.md), without the newline:
/// one JSON object with Python's json.dumps separators. A non-finite loss
/// and an unmeasured grad_norm are null.
std::string metricsLine(const StepReport &report);

/// The --metrics file: one metricsLine per step, flushed as it is written.
class MetricsFile {
public:
  MetricsFile() = default;
  ~MetricsFile();
  MetricsFile(const MetricsFile &) = delete;
  MetricsFile &operator=(const MetricsFile &) = delete;

  /// Creates (truncates) the file at `path`; with `append` (a resumed run),
  /// adds to what it holds.
  Status open(const std::string &path, bool append = false);
  bool isOpen() const { return file != nullptr; }
  /// Appends the line of `report`; does nothing when not open. An error
  /// when the line could not be written (a full disk).
  Status write(const StepReport &report);
  /// Closes the file; an error when its data could not be written.
  Status close();

private:
  std::string path;
  FILE *file = nullptr;
};

/// The --profile table of one rank (`who`): every kernel op and instruction
/// kind by decreasing time, over the `steps` steps from `firstStep` that
/// took `stepSeconds` in all.
std::string profileTable(const std::string &who, const Executor &exec,
                         int64_t firstStep, int64_t steps, double stepSeconds);

/// The end-of-run memory line of `who`: the runtime's own high-water mark
/// (persistent state plus step buffers and segment values) next to the
/// compiler's prediction, and the peak RSS.
std::string memoryReport(const std::string &who, const Executor &exec);
/// The line saying what the device stores as packed bf16
/// (Executor::packedCounts), or "" where nothing is (fp32 plans,
/// --unpack-step-buffers, the CPU backend).
std::string packedReport(const std::string &who, const Executor &exec);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_RANK_REPORTING_H
