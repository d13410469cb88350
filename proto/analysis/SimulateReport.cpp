// The simulator's text reports: piper-plan --simulate and the predicted step
// lines of piperc's report.txt (see Simulate.h).
#include <cmath>
#include <cstdio>

#include "proto/analysis/Simulate.h"
#include "proto/analysis/SimulateCost.h"

namespace piper::plan {

using simcost::isFree;

std::string formatSeconds(double s) {
  const char *unit = "s";
  double v = s;
  double a = std::fabs(s);
  if (a != 0 && a < 1e-6) {
    v = s * 1e9;
    unit = "ns";
  } else if (a != 0 && a < 1e-3) {
    v = s * 1e6;
    unit = "us";
  } else if (a != 0 && a < 1) {
    v = s * 1e3;
    unit = "ms";
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g %s", v, unit);
  return buf;
}

std::string simulationReport(const Simulation &sim, bool timeline) {
  auto rate = [](double r, const char *unit, double scale) {
    if (isFree(r))
      return std::string("free");
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4g %s", r / scale, unit);
    return std::string(buf);
  };
  std::string out =
      "machine: compute " + rate(sim.machine.flopsPerSecond, "TFLOP/s", 1e12) +
      ", memory " + rate(sim.machine.memoryBytesPerSecond, "GB/s", 1e9) +
      ", link " + rate(sim.machine.linkBytesPerSecond, "GB/s", 1e9) + " + " +
      formatSeconds(sim.machine.linkLatencySeconds) + " latency" +
      (sim.machine.devicesPerNode > 0
           ? " between nodes of " + std::to_string(sim.machine.devicesPerNode) +
                 " devices, " +
                 rate(sim.machine.nodeLinkBytesPerSecond, "GB/s", 1e9) + " + " +
                 formatSeconds(sim.machine.nodeLinkLatencySeconds) +
                 " within one"
           : std::string()) +
      (sim.machine.shareCompute ? ", one compute engine per device" : "") +
      (sim.machine.commUsesCompute ? ", which communication uses too" : "") +
      "\n";
  char buf[256];
  for (const ClassTime &ct : sim.classes) {
    std::string ranks;
    for (size_t i = 0; i < ct.ranks.size(); ++i)
      ranks += (i ? ", " : "") + std::to_string(ct.ranks[i]);
    std::snprintf(buf, sizeof buf, "%.2f%%", 100 * ct.bubbleFraction);
    out += "class " + std::to_string(ct.deviceClass) + " ranks [" + ranks +
           "]: step " + formatSeconds(ct.stepTime) + ", compute busy " +
           formatSeconds(ct.computeBusy) + ", bubble " + buf + " (" +
           formatSeconds(ct.stepTime - ct.computeBusy) + "), " +
           formatSeconds(ct.spanIdle) +
           " idle between its first and last segment\n";
    for (size_t s = 0; s < ct.streams.size(); ++s) {
      const StreamTime &stream = ct.streams[s];
      std::snprintf(buf, sizeof buf, "%.2f%%",
                    ct.stepTime > 0 ? 100 * stream.busy / ct.stepTime : 0.0);
      out += "  stream " + std::to_string(s) + " '" + stream.name + "': busy " +
             formatSeconds(stream.busy) + " (" + buf + "), ends at " +
             formatSeconds(stream.end) +
             (stream.compute ? "" : ", no compute") + "\n";
    }
    if (!timeline)
      continue;
    for (const TimelineEntry &e : ct.timeline) {
      if (e.kind == Instruction::RECORD || e.kind == Instruction::WAIT)
        continue;
      out += "    " + formatSeconds(e.start) + " .. " + formatSeconds(e.end) +
             "  stream " + std::to_string(e.stream) + " #" +
             std::to_string(e.inst) + " " + Instruction::Kind_Name(e.kind) +
             " " + e.label + "\n";
    }
  }
  out += "step: " + formatSeconds(sim.stepTime) + " (the slowest class)\n";
  return out;
}

std::string predictedStepReport(const std::vector<Plan> &plans) {
  Simulation sim;
  std::string error;
  if (!simulate(plans, Machine(), SimulateOptions(), sim, error))
    return "predicted step: not simulated: " + error + "\n";
  std::string out = "predicted step " + formatSeconds(sim.stepTime) +
                    " on the default machine (docs/simulator.md; piper-plan "
                    "--simulate shows the timeline)\n";
  char buf[64];
  for (const ClassTime &ct : sim.classes) {
    std::snprintf(buf, sizeof buf, "%.2f%%", 100 * ct.bubbleFraction);
    out += "  class " + std::to_string(ct.deviceClass) + ": step " +
           formatSeconds(ct.stepTime) + ", compute busy " +
           formatSeconds(ct.computeBusy) + ", bubble " + buf + "\n";
  }
  return out;
}

} // namespace piper::plan
