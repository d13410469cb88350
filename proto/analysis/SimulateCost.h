// The simulator's cost model (docs/simulator.md): what one instruction costs
// on a Machine, and the fixed durations of SimulateOptions::overrides that
// replace it. The event loop that orders the instructions and synchronizes
// the devices is Simulate.cpp; the text reports are SimulateReport.cpp.
#ifndef PIPER_PROTO_ANALYSIS_SIMULATECOST_H
#define PIPER_PROTO_ANALYSIS_SIMULATECOST_H

#include <string>
#include <vector>

#include "proto/analysis/Simulate.h"
#include "proto/plan.pb.h"

namespace piper::plan::simcost {

/// Whether a resource of `rate` (per second) costs nothing: 0, negative,
/// NaN or infinite.
bool isFree(double rate);

/// Seconds to process `amount` at `rate`; 0 when there is nothing to do or
/// the resource is free.
double timeFor(double amount, double rate);

/// A CALL of `segment`: a roofline over its recorded cost,
/// max(flops / flopsPerSecond, bytes_moved / memoryBytesPerSecond).
double callTime(const Machine &m, const Segment &segment);

/// Whether `ranks` all sit in one node of `m` (Machine::devicesPerNode):
/// then they talk over the node's link.
bool withinOneNode(const Machine &m, const std::vector<int> &ranks);

/// A SEND/RECV transfer of `bytes`: latency, then the link's rate (the
/// node's link when `withinNode`). `byteSeconds`, when given, receives the
/// second part alone (what Machine::commUsesCompute charges the engines).
double pointToPoint(const Machine &m, double bytes, bool withinNode = false,
                    double *byteSeconds = nullptr);

/// A ring collective over `n` ranks making `passes` passes over `bytes`
/// (ringPasses), on the node's link when `withinNode`: the link's latency
/// and (n-1)/n of the bytes per pass; 0 for one rank. `byteSeconds`, when
/// given, receives the time of the bytes alone.
double ringCollective(const Machine &m, int n, double bytes, double passes,
                      bool withinNode = false, double *byteSeconds = nullptr);

/// Ring passes of a collective of `kind`: 2 for an all-reduce and
/// CLIP_GRADS's norm (reduce-scatter then all-gather), 1 for a
/// reduce-scatter, an all-gather or an all-to-all.
double ringPasses(Instruction::Kind kind);

/// Bytes a step buffer occupies on the wire: packed bf16 for float32
/// buffers of bf16 plans, as the runtime sends them.
double wireBytes(const Plan &plan, const TensorType &type);

/// What collective `inst` of `plan` (isCollective) costs besides the ring's
/// latency: `bytes`, the ring's payload, and `local`, seconds of local work
/// after it. CLIP_GRADS: one float (the squared norm), then reading and
/// scaling every gradient; a group collective: its parameters' float32
/// tensors and, for a value collective, the full tensor (an all-reduce's
/// or reduce-scatter's input, an all-gather's output, an all-to-all's
/// input as if it were full and spread evenly). False with `error` (the
/// problem, without the position) on a parameter or buffer out of range.
bool collectiveCost(const Machine &m, const Plan &plan, const Instruction &inst,
                    double &bytes, double &local, std::string &error);

/// A fixed duration for `inst` of `plan` from `options.overrides`: a CALL
/// whose segment's pass is a key, else the longest key that starts the
/// instruction's label. False when none applies.
bool overrideFor(const SimulateOptions &options, const Plan &plan,
                 const Instruction &inst, double &seconds);

} // namespace piper::plan::simcost

#endif // PIPER_PROTO_ANALYSIS_SIMULATECOST_H
