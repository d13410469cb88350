// The kernel fusions the lowering to plans makes inside one segment: ops
// whose plan kernels merge into another op's kernel (docs/design-notes.md
// §2, docs/kernels.md).
#ifndef PIPER_COMPILER_LOWERING_SEGMENTFUSIONS_H
#define PIPER_COMPILER_LOWERING_SEGMENTFUSIONS_H

#include "mlir/IR/Block.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::piper {

/// What one segment's kernels fuse. Each map goes from the op whose
/// position runs the fused kernel to the op merged into it, which the
/// lowering then skips.
struct SegmentFusions {
  /// A linear_grad_weight(_bias) whose weight gradient only goes to its
  /// parameter's accumulate_grad, with nothing in between naming that
  /// parameter: its kernel adds the gradient to the accumulator itself
  /// (`accumulate`), and the accumulator's additions keep their order.
  DenseMap<Operation *, Operation *> accumulatesInto;
  /// A linear whose result a gelu reads: one `linear_gelu` kernel (h, then
  /// gelu(h)); the linear's result keeps its other uses (the backward's h).
  DenseMap<Operation *, Operation *> geluAfter;
  /// A gelu_grad whose product comes from a linear_grad_input used only
  /// there, with no adamw in between (nothing changes the weight): one
  /// `linear_grad_input_gelu` kernel at the gelu_grad's position (where h
  /// is computed: under recomputation it may come after the product).
  /// Maps the gelu_grad to its linear_grad_input, which is skipped.
  DenseMap<Operation *, Operation *> geluGradOf;

  /// Whether `op`'s kernel is merged into another op's.
  bool absorbed(Operation *op) const { return merged.count(op) != 0; }
  /// Every merged op, to the op whose kernel runs it.
  DenseMap<Operation *, Operation *> merged;
};

/// The fusions of a segment's body: none unless `fuse` (piperc's
/// --no-fused-epilogues turns them off).
SegmentFusions findSegmentFusions(Block &body, bool fuse);

} // namespace mlir::piper

#endif // PIPER_COMPILER_LOWERING_SEGMENTFUSIONS_H
