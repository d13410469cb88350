// piper-run --trace: the measured timeline of one step as a Chrome /
// Perfetto trace in the format of the predicted one (piper-plan --trace):
// every rank turns its executor's StepTrace into a part, rank 0 merges the
// parts of all ranks into one file (docs/piper-run.md, Trace).
#ifndef PIPER_RUNTIME_LAUNCH_RANK_TRACE_H
#define PIPER_RUNTIME_LAUNCH_RANK_TRACE_H

#include <cstdint>
#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "runtime/exec/Executor.h"
#include "support/Status.h"

namespace piper::runtime {

class WatchStore;

/// The measured compute bubble of one rank's traced step: the step runs
/// from StepTrace::startNs to endNs; compute busy is the time in which at
/// least one CALL runs on any of its streams (the union of their spans);
/// the bubble is (step - compute busy) / step, as the simulator defines it
/// (docs/simulator.md).
struct MeasuredBubble {
  double stepSeconds = 0;
  double computeBusySeconds = 0;
  double fraction = 0;
};
MeasuredBubble measuredBubble(const plan::Plan &plan, const StepTrace &trace);

/// Rank `rank`'s part of the trace (JSON text): its host, step window,
/// bubble, stream names and one "X" event per instruction that ran (named
/// by its plan label, times in microseconds from its own step start). A
/// trace not recorded (StepTrace::step 0) gives a part saying so.
std::string traceRankPart(const plan::Plan &plan, int rank,
                          const std::string &host, const StepTrace &trace);

/// The whole trace from every rank's part (`parts[r]` is rank r's; empty
/// when it never arrived): one process per rank ("rank R", pid R), one
/// thread per plan stream, the events shifted so that time 0 is the
/// earliest rank's step start when all parts come from one host (a shared
/// steady clock), else each rank's own step start. `summary` gets the lines
/// piper-run prints (step, compute busy and bubble per rank), `tracedStep`
/// the step. Parts of different steps are an error.
Status mergeTraceParts(const std::vector<std::string> &parts,
                       std::string &traceJson, std::string &summary,
                       int64_t &tracedStep);

/// The store key of rank `rank`'s part.
std::string traceKey(int rank);

/// Rank 0's end of --trace: reads every other rank's part from `store`
/// (null with one rank), merges them with its own and writes `path`
/// atomically; prints the summary on stderr.
Status writeMeasuredTrace(const std::string &path, WatchStore *store,
                          int worldSize, const std::string &ownPart);

/// This machine's host name ("" if unknown).
std::string hostName();

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_RANK_TRACE_H
