// Rank 0's progress on stdout: a line every --log-every steps (and at the
// last step) and a summary at the end of the run.
#ifndef PIPER_RUNTIME_LAUNCH_RANK_PROGRESS_H
#define PIPER_RUNTIME_LAUNCH_RANK_PROGRESS_H

#include <cstdint>
#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "runtime/launch/rank/Reporting.h"

namespace piper::runtime {

/// `seconds` as "H:MM:SS", rounded to the nearest second (hours are not
/// wrapped: "123:04:05"); a negative or non-finite value is "?".
std::string formatClock(double seconds);

/// `bytes` in the largest binary unit that keeps it at least 1: "512 B",
/// "17.4 KiB", "16.6 MiB", "2.3 GiB".
std::string formatBytes(int64_t bytes);

/// The model FLOPs of one training step, 6 * N * tokens, where N counts
/// every distinct parameter of `plans` once at its global shape (replicas,
/// tied copies and an expert weight's blocks are one parameter; every
/// expert counts, not only the routed top-k). The usual
/// estimate behind MFU: forward and backward matrix products only.
double modelFlopsPerStep(const std::vector<plan::Plan> &plans,
                         double tokensPerStep);

/// The progress of a run of steps firstStep..lastStep (inclusive; after
/// --load, step numbers continue from the checkpoint's).
class Progress {
public:
  /// `logEvery` >= 1: a line for every step divisible by it, and the last.
  /// `tokensPerStep`: the tokens of one step over all replicas.
  Progress(int64_t firstStep, int64_t lastStep, int64_t logEvery,
           double tokensPerStep);

  /// MFU (model FLOPs utilization) is shown only when both are positive:
  /// the FLOPs of one step (modelFlopsPerStep) and the peak FLOP/s of all
  /// the run's devices together, which only a backend that knows its
  /// hardware reports (hal::Device::peakFlops; the CPU backend does not).
  void setFlops(double flopsPerStep, double peakFlopsPerSecond);

  /// Records a step that ran (steps come in order). Returns its line,
  /// without a newline, when the step is one to print, else "":
  ///
  ///   step 4/10 | loss 2.90132034 | grad_norm 1.286 | 15389 tokens/s |
  ///   213.4 ms/step | ETA 0:00:01
  ///
  /// (one line). Loss and grad_norm are the step's own; tokens/s and
  /// ms/step are averaged over the steps since the previous line. ETA is
  /// the steps left times the mean step time so far, the first (warm-up)
  /// step left out once another has run.
  std::string record(const StepReport &report);

  /// The summary of the steps recorded, each line ending in a newline ("" if
  /// none ran): steps and wall time, mean throughput and step time with the
  /// first (warm-up) step left out unless it is the only one, and the peak
  /// arena memory of every rank (`peakBytesPerRank`, indexed by rank; only
  /// the extremes beyond 8 ranks). `wallSeconds`: the whole run of the rank.
  std::string summary(const std::vector<int64_t> &peakBytesPerRank,
                      double wallSeconds) const;

private:
  /// Mean seconds of one step so far, warm-up excluded when possible.
  double meanStepSeconds() const;
  /// "MFU 41.3%" for steps of `seconds` each, or "" when not known.
  std::string mfu(double seconds) const;

  int64_t firstStep, lastStep, logEvery;
  double tokensPerStep;
  double flopsPerStep = 0, peakFlops = 0;
  /// Steps recorded, their total time and the first step's.
  int64_t steps = 0;
  double seconds = 0, firstSeconds = 0;
  /// Steps and time since the previous line.
  int64_t intervalSteps = 0;
  double intervalSeconds = 0;
};

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_RANK_PROGRESS_H
