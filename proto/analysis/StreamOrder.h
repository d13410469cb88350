// The happens-before order of one plan's instructions within a step: program
// order on each stream, plus RECORD -> WAIT edges between streams. Shared by
// the runtime's validator (races, reads before writes) and the memory planner
// (which buffers may share bytes).
#ifndef PIPER_PROTO_ANALYSIS_STREAMORDER_H
#define PIPER_PROTO_ANALYSIS_STREAMORDER_H

#include <cstdint>
#include <string>
#include <vector>

#include "proto/plan.pb.h"

namespace piper::plan {

/// A position in a plan: stream index and instruction index.
struct Pos {
  int stream = -1;
  int inst = -1;
  bool valid() const { return stream >= 0; }
  bool operator==(const Pos &o) const {
    return stream == o.stream && inst == o.inst;
  }
};

/// Vector clocks of a plan's instructions, from simulating its streams with
/// events as the only cross-stream edges. `happensBefore(a, b)` holds when
/// instruction `a` completes before `b` starts in every execution.
class StreamOrder {
public:
  /// Builds the order of `plan`, whose event indices must already be in
  /// range. Fails, naming the blocked instructions, when the streams
  /// deadlock on events (a WAIT whose event is recorded after it, directly
  /// or through other streams, or never).
  static bool build(const Plan &plan, StreamOrder &order, std::string &error);

  bool happensBefore(Pos a, Pos b) const {
    if (a.stream == b.stream)
      return a.inst < b.inst;
    return clock[b.stream][b.inst][a.stream] > a.inst;
  }
  /// Neither instruction is ordered before the other: they may overlap.
  bool concurrent(Pos a, Pos b) const {
    return !(a == b) && !happensBefore(a, b) && !happensBefore(b, a);
  }
  /// A number that grows along happens-before (if a happens before b, then
  /// rank(a) < rank(b)): sorting by it gives one execution order of the
  /// step. The sum of the instruction's vector clock.
  int64_t rank(Pos p) const {
    int64_t sum = 0;
    for (int n : clock[p.stream][p.inst])
      sum += n;
    return sum;
  }
  int numStreams() const { return static_cast<int>(clock.size()); }
  int numInstructions(int stream) const {
    return static_cast<int>(clock[stream].size());
  }
  /// Where each event is recorded (invalid when no instruction records it).
  const std::vector<Pos> &recordedAt() const { return recorded; }

private:
  /// clock[s][i][t]: how many instructions of stream t are known to have
  /// completed when instruction i of stream s starts.
  std::vector<std::vector<std::vector<int>>> clock;
  std::vector<Pos> recorded;
};

/// "stream 'NAME', instruction I (LABEL)", for diagnostics.
std::string describePosition(const Plan &plan, Pos pos);

} // namespace piper::plan

#endif // PIPER_PROTO_ANALYSIS_STREAMORDER_H
