// Pictures of a simulated step (proto/analysis/Simulate.h): a standalone SVG
// (one row per device class, one lane per stream, boxes coloured by pass and
// labelled by microbatch) and the Chrome/Perfetto trace JSON; and the two
// files piperc compile writes next to report.txt (docs/simulator.md).
#ifndef PIPER_PROTO_ANALYSIS_TIMELINESVG_H
#define PIPER_PROTO_ANALYSIS_TIMELINESVG_H

#include <string>
#include <vector>

#include "proto/analysis/Simulate.h"
#include "proto/plan.pb.h"

namespace piper::plan {

/// The file names piperc compile writes into OUT/.
inline constexpr const char *kTimelineTraceFileName = "timeline.json";
inline constexpr const char *kTimelineSvgFileName = "timeline.svg";

/// The microbatch an instruction label names ("... MB=3 ..." gives 3), or -1.
int labelMicrobatch(const std::string &label);

/// `sim` (of `plans`, in the same order) as a standalone SVG document: per
/// device class a row labelled "class C: ranks [..]", in it one lane per
/// stream that has work (a CALL or a communication), a box per such
/// instruction from its start to its end: CALLs coloured by their segment's
/// pass (F, B, BI, BW, U; others alike) and labelled with their microbatch
/// when the label names it, communication grey; a time axis and a legend.
/// Every box is a <rect class="box call"> or <rect class="box comm"> with a
/// <title> (label and times) for viewers.
std::string timelineSvg(const Simulation &sim, const std::vector<Plan> &plans);

/// `sim` as a Chrome / Perfetto trace (JSON text): one process per device
/// class ("class C ranks [..]"), one thread per stream, an "X" event per
/// instruction but RECORD and WAIT, named by its label, times in
/// microseconds; "metadata" holds "source": "simulated" and, per class in
/// plan order, "bubble_fraction" and "step_seconds".
std::string timelineTraceJson(const Simulation &sim);

/// Simulates `plans` on the default Machine and writes
/// `dir`/timeline.json and `dir`/timeline.svg. Returns false, with the
/// reason in `error`, only when a file cannot be written; `reportLine` is
/// the line for report.txt naming the files (or why there are none: plans
/// the simulator cannot finish).
bool writeTimelineFiles(const std::vector<Plan> &plans, const std::string &dir,
                        std::string &reportLine, std::string &error);

} // namespace piper::plan

#endif // PIPER_PROTO_ANALYSIS_TIMELINESVG_H
