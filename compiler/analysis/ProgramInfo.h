// What a program's nodes and segments are: each node's stream and devices,
// a description for diagnostics, and the estimated cost of a segment. Asked
// by the rewrites (compiler/transforms), the lowering to plans
// (compiler/lowering) and the reports, which need nothing else of the
// transforms.
#ifndef PIPER_COMPILER_ANALYSIS_PROGRAMINFO_H
#define PIPER_COMPILER_ANALYSIS_PROGRAMINFO_H

#include <string>

#include "dialects/piper/PiperDialect.h"

namespace mlir::piper {

/// Estimated FLOPs of one op (used to balance stages and in reports).
double estimateFlops(Operation *op);

/// The estimated cost of one call of a segment.
struct SegmentCost {
  double flops = 0, bytes = 0;
};
/// The sum over `seg`'s ops, as `stage`, the plans (Segment.flops,
/// bytes_moved) and test-print-cost count it: FLOPs by estimateFlops
/// (structural ops count their results), bytes by CostOpInterface. The
/// parameter-state ops name their parameter instead of taking tensors, so
/// they count per element of it: accumulate_grad 1 FLOP and 12 bytes (reads
/// the gradient and the accumulator, writes the accumulator), adamw about 12
/// FLOPs and 28 bytes (reads gradient, value and both moments, writes the
/// last three), zero_grad 4 bytes.
SegmentCost estimateSegmentCost(SegmentOp seg);

/// The logical stream a node of a device program is issued on; tasks
/// without one, and batches, use "compute".
StringRef streamOf(Operation *op);
/// The default compute stream of tasks, "compute".
StreamAttr computeStream(MLIRContext *ctx);

/// The device group of a program node (empty for batches, transfers, sends,
/// receives and nodes not placed yet).
ArrayRef<int64_t> devicesOf(Operation *op);

/// "[0, 1, 2]" for diagnostics.
std::string formatDevices(ArrayRef<int64_t> devices);

/// "task @stage1_F (PP=1 MB=0 PASS=F)" for diagnostics.
std::string describeNode(Operation *op);

} // namespace mlir::piper

#endif // PIPER_COMPILER_ANALYSIS_PROGRAMINFO_H
