// A timed simulation of one training step of a compiled strategy: every
// device class's streams run their instructions in order, with costs from a
// machine description (or fixed per pass, for tests), events ordering the
// streams of a device, and point-to-point transfers and collectives
// synchronizing devices. It predicts per class the step time, the busy time
// of every stream and the compute bubble. The model, its formulas and its
// limitations are in docs/simulator.md.
#ifndef PIPER_PROTO_ANALYSIS_SIMULATE_H
#define PIPER_PROTO_ANALYSIS_SIMULATE_H

#include <map>
#include <string>
#include <vector>

#include "proto/plan.pb.h"

namespace piper::plan {

/// What one device can do. Costs of one instruction:
///   CALL        max(flops / flopsPerSecond, bytes_moved /
///   memoryBytesPerSecond)
///               (a roofline over the segment's recorded cost)
///   SEND/RECV   linkLatencySeconds + bytes / linkBytesPerSecond
///   ALL_REDUCE  over n ranks: 2 linkLatencySeconds
///               + 2 (n - 1) / n * bytes / linkBytesPerSecond (a ring, two
///               passes of a latency each); 0 if n = 1
///   REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL   one pass: linkLatencySeconds
///               + (n - 1) / n * bytes / linkBytesPerSecond
///   CLIP_GRADS  the all-reduce of one float over the world, then
///               2 * gradient bytes / memoryBytesPerSecond (norm and scaling)
///   LOAD_BATCH, RECORD, WAIT   0
/// A rate of 0 (or infinity) makes that resource free.
struct Machine {
  /// The default: one H100 SXM-class GPU at a realistic dense rate (about
  /// 40% of the bf16 peak), HBM3, and a 400 Gb/s InfiniBand NDR link per GPU.
  double flopsPerSecond = 400e12;
  /// The dense peak rate the MFU of piperc search is quoted against (H100
  /// and H200 SXM bf16: 989 TFLOP/s); the simulator itself runs at
  /// flopsPerSecond.
  double peakFlopsPerSecond = 989e12;
  double memoryBytesPerSecond = 3.0e12;
  double linkBytesPerSecond = 50e9;
  double linkLatencySeconds = 10e-6;
  /// Devices per node (0: no nodes, every link is the link above). With
  /// nodes, ranks r and s share one when r / devicesPerNode == s /
  /// devicesPerNode, and a transfer or collective whose ranks all share one
  /// runs on the node's link (NVLink: 900 GB/s per H100/H200 GPU, both
  /// directions together) instead of the link between nodes.
  int devicesPerNode = 0;
  double nodeLinkBytesPerSecond = 450e9;
  double nodeLinkLatencySeconds = 5e-6;
  /// One compute engine per device: the CALLs of a device's compute
  /// streams run one at a time, each when its stream reaches it and the
  /// engine is free (a GPU whose kernels each fill its SMs). False: every
  /// compute stream runs at the full rate beside the others.
  bool shareCompute = false;
  /// Communication takes the compute engine's time too (with shareCompute):
  /// the byte time of every collective and transfer (its bytes over the
  /// link's rate, not the latency) also occupies the engine of each device
  /// it involves, from when it starts. What CPU ranks do: Gloo copies every
  /// byte it sends or receives, and sums what it reduces, on the cores the
  /// kernels run on. False for GPUs (NCCL's copies take few of the SMs).
  bool commUsesCompute = false;
};

/// How the simulation runs, beyond the machine.
struct SimulateOptions {
  /// Fixed durations in seconds that replace the machine's cost. A key
  /// matches a CALL whose segment's pass (the name's suffix after the last
  /// '_': "stage0_B" has pass "B") equals it; otherwise it matches any
  /// instruction whose label starts with it (the longest such key wins).
  /// E.g. {{"F", 1}, {"B", 2}, {"U", 0}}.
  std::map<std::string, double> overrides;
  /// By default a SEND is asynchronous, as the plan format defines it (the
  /// runtime starts it and waits for it at the end of the step): its stream
  /// moves on at once, and the step ends when all its sends have completed.
  /// With `blockingSends` (NCCL's semantics on a GPU stream) a SEND holds
  /// its stream until the transfer completes; a 1F1B plan whose sends and
  /// receives share one stream then deadlocks, as it would under NCCL.
  bool blockingSends = false;
};

/// One instruction as simulated. `issue`: when its stream reached it;
/// `start`: when it began to work (after a rendezvous or collective
/// gathered its peers, or a WAIT's event fired); `end`: when it completed
/// and its stream moved on (for an asynchronous SEND, when the transfer
/// completed).
struct TimelineEntry {
  int stream = 0;
  int inst = 0;
  Instruction::Kind kind = Instruction::KIND_UNSPECIFIED;
  std::string label;
  double issue = 0, start = 0, end = 0;
};

struct StreamTime {
  std::string name;
  /// Seconds of work: the sum of end - start over CALL, SEND, RECV,
  /// ALL_REDUCE and CLIP_GRADS (waiting for peers or events is idle).
  double busy = 0;
  double end = 0;       // when its last instruction completed
  bool compute = false; // it runs at least one CALL
};

struct ClassTime {
  int deviceClass = 0;
  std::vector<int> ranks;
  /// When the class's last stream finishes (asynchronous sends included),
  /// the step starting at 0 on every device.
  double stepTime = 0;
  /// Seconds in which at least one CALL runs, over all streams.
  double computeBusy = 0;
  /// (stepTime - computeBusy) / stepTime: the compute stream(s) idle.
  double bubbleFraction = 0;
  /// Seconds without a CALL between the class's first CALL and its last:
  /// the bubble inside its span, without the fill before it and the drain
  /// after it (what ZB-H2's formula counts).
  double spanIdle = 0;
  std::vector<StreamTime> streams;
  std::vector<TimelineEntry> timeline; // every instruction, stream by stream
};

struct Simulation {
  Machine machine;
  std::vector<ClassTime> classes; // in the order of the plans given
  double stepTime = 0;            // the slowest class
};

/// Simulates one step of `plans`, the plans of one compiled strategy (one per
/// device class; all data-parallel replicas of a class run its plan the same
/// way, so replica 0 stands for all). A SEND is matched with the RECV of the
/// same tag on a stream of the same name in the peer's class; collectives
/// on a group with the members' earlier collectives on that group and
/// stream name; CLIP_GRADS is one collective of the whole world. Fails, with
/// the reason in `error`, on an instruction it cannot simulate, and when
/// the plans cannot finish: every blocked stream is named with its
/// instruction and what it waits for.
bool simulate(const std::vector<Plan> &plans, const Machine &machine,
              const SimulateOptions &options, Simulation &out,
              std::string &error);

/// The pass of a segment: its name's suffix after the last '_' ("" if none).
std::string segmentPass(const std::string &segmentName);

/// Seconds in a readable unit with four significant digits: "33 s",
/// "1.5 ms", "12.25 us".
std::string formatSeconds(double seconds);

/// The simulation as text: the machine, per class its step time, compute
/// busy time and bubble, and per stream its busy time; with `timeline`
/// every instruction's start and end.
std::string simulationReport(const Simulation &sim, bool timeline);

/// The lines `piperc compile` writes into report.txt: the machine, the
/// predicted step time and, per class, step time, compute busy time and
/// bubble, from simulating `plans` on the default Machine; or the reason
/// the plans could not be simulated.
std::string predictedStepReport(const std::vector<Plan> &plans);

} // namespace piper::plan

#endif // PIPER_PROTO_ANALYSIS_SIMULATE_H
