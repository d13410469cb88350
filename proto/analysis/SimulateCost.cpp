// The simulator's cost model (see SimulateCost.h and docs/simulator.md).
#include "proto/analysis/SimulateCost.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "proto/PlanTensors.h"

namespace piper::plan {

std::string segmentPass(const std::string &name) {
  size_t at = name.rfind('_');
  return at == std::string::npos ? "" : name.substr(at + 1);
}

namespace simcost {
namespace {

double latency(double seconds) {
  return std::isfinite(seconds) && seconds > 0 ? seconds : 0;
}

/// The latency and rate of the link a transfer or collective uses.
std::pair<double, double> linkOf(const Machine &m, bool withinNode) {
  return withinNode ? std::make_pair(latency(m.nodeLinkLatencySeconds),
                                     m.nodeLinkBytesPerSecond)
                    : std::make_pair(latency(m.linkLatencySeconds),
                                     m.linkBytesPerSecond);
}

/// Bytes of a parameter's float32 value (or gradient).
double paramBytes(const Parameter &p) {
  double n = 4;
  for (int64_t d : p.type().shape())
    n *= double(d);
  return n;
}

} // namespace

bool isFree(double rate) { return !(rate > 0) || std::isinf(rate); }

double timeFor(double amount, double rate) {
  return amount <= 0 || isFree(rate) ? 0 : amount / rate;
}

double callTime(const Machine &m, const Segment &seg) {
  return std::max(timeFor(seg.flops(), m.flopsPerSecond),
                  timeFor(seg.bytes_moved(), m.memoryBytesPerSecond));
}

bool withinOneNode(const Machine &m, const std::vector<int> &ranks) {
  if (m.devicesPerNode <= 0 || ranks.empty())
    return false;
  return std::all_of(ranks.begin(), ranks.end(), [&](int r) {
    return r / m.devicesPerNode == ranks[0] / m.devicesPerNode;
  });
}

double pointToPoint(const Machine &m, double bytes, bool withinNode,
                    double *byteSeconds) {
  auto [seconds, rate] = linkOf(m, withinNode);
  double onWire = timeFor(bytes, rate);
  if (byteSeconds)
    *byteSeconds = onWire;
  return seconds + onWire;
}

double ringCollective(const Machine &m, int n, double bytes, double passes,
                      bool withinNode, double *byteSeconds) {
  if (byteSeconds)
    *byteSeconds = 0;
  if (n <= 1)
    return 0;
  // Each pass around the ring pays the link's latency once (a message
  // from each member to the next) and carries (n-1)/n of the bytes: an
  // all-reduce (a reduce-scatter, then an all-gather) pays it twice.
  auto [seconds, rate] = linkOf(m, withinNode);
  double onWire = passes * (n - 1) / n * timeFor(bytes, rate);
  if (byteSeconds)
    *byteSeconds = onWire;
  return passes * seconds + onWire;
}

double ringPasses(Instruction::Kind kind) {
  return kind == Instruction::ALL_REDUCE || kind == Instruction::CLIP_GRADS ? 2
                                                                            : 1;
}

double wireBytes(const Plan &plan, const TensorType &type) {
  return double(std::max<int64_t>(tensorBytes(storedType(plan, type)), 0));
}

bool collectiveCost(const Machine &m, const Plan &plan, const Instruction &inst,
                    double &bytes, double &local, std::string &error) {
  bytes = 0;
  local = 0;
  if (inst.kind() == Instruction::CLIP_GRADS) {
    bytes = 4; // one float: the squared norm
    double grads = 0;
    for (const Parameter &p : plan.params())
      grads += paramBytes(p);
    local = timeFor(2 * grads, m.memoryBytesPerSecond);
    return true;
  }
  for (int p : inst.params()) {
    if (p < 0 || p >= plan.params_size()) {
      error = "parameter " + std::to_string(p) + " is out of range";
      return false;
    }
    bytes += paramBytes(plan.params(p));
  }
  // Value collectives: the full tensor's bytes (the input of an
  // all-reduce or reduce-scatter, the output of an all-gather; an
  // all-to-all's input, as if it were full and spread evenly).
  const auto &ids =
      inst.kind() == Instruction::ALL_GATHER ? inst.outputs() : inst.inputs();
  // ZeRO's forms: the parameters' whole tensors, counted above.
  bool zero = inst.kind() == Instruction::REDUCE_SCATTER_GRADS ||
              inst.kind() == Instruction::ALL_GATHER_PARAMS;
  for (int i = 0; !zero && i < ids.size(); ++i) {
    if (inst.kind() == Instruction::ALL_TO_ALL && i > 0)
      break; // the counts
    if (ids[i] < 0 || ids[i] >= plan.buffers_size()) {
      error = "buffer " + std::to_string(ids[i]) + " is out of range";
      return false;
    }
    bytes += wireBytes(plan, plan.buffers(ids[i]).type());
  }
  return true;
}

bool overrideFor(const SimulateOptions &options, const Plan &plan,
                 const Instruction &inst, double &seconds) {
  if (options.overrides.empty())
    return false;
  if (inst.kind() == Instruction::CALL && inst.segment() >= 0 &&
      inst.segment() < plan.segments_size()) {
    auto it = options.overrides.find(
        segmentPass(plan.segments(inst.segment()).name()));
    if (it != options.overrides.end()) {
      seconds = it->second;
      return true;
    }
  }
  size_t best = 0;
  bool found = false;
  for (const auto &[key, value] : options.overrides)
    if (inst.label().compare(0, key.size(), key) == 0 &&
        (!found || key.size() > best)) {
      best = key.size();
      seconds = value;
      found = true;
    }
  return found;
}

} // namespace simcost
} // namespace piper::plan
