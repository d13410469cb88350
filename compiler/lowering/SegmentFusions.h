// The kernel fusions the lowering to plans makes inside one segment: ops
// whose plan kernels merge into another op's kernel (docs/design-notes.md
// §2, docs/kernels.md).
#ifndef PIPER_COMPILER_LOWERING_SEGMENTFUSIONS_H
#define PIPER_COMPILER_LOWERING_SEGMENTFUSIONS_H

#include "proto/plan.pb.h"

#include "mlir/IR/Block.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLFunctionalExtras.h"

namespace mlir::piper {

/// What one segment's kernels fuse. Each map goes from the op whose
/// position runs the fused kernel to the op merged into it, which the
/// lowering then skips.
struct SegmentFusions {
  /// A linear_grad_weight(_bias) whose weight gradient only goes to its
  /// parameter's accumulate_grad, with nothing in between naming that
  /// parameter, or a layer_norm_grad_weight / rms_norm_grad_weight each of
  /// whose results does: its kernel adds the gradients to the accumulators
  /// itself (`accumulate`), and the accumulators' additions keep their
  /// order. Maps the op to the accumulate_grad of each result (null for
  /// linear_grad_weight_bias's bias gradient, which stays a value).
  DenseMap<Operation *, SmallVector<Operation *, 2>> accumulatesInto;
  /// A linear whose result a gelu reads: one `linear_gelu` kernel (h, then
  /// gelu(h)); the linear's result keeps its other uses (the backward's h).
  DenseMap<Operation *, Operation *> geluAfter;
  /// A gelu_grad whose product comes from a linear_grad_input used only
  /// there, with no adamw in between (nothing changes the weight): one
  /// `linear_grad_input_gelu` kernel at the gelu_grad's position (where h
  /// is computed: under recomputation it may come after the product).
  /// Maps the gelu_grad to its linear_grad_input, which is skipped.
  DenseMap<Operation *, Operation *> geluGradOf;
  /// A layer_norm or rms_norm of an add's result that nothing between the
  /// two reads: one `add_layer_norm` (`add_rms_norm`) kernel at the norm's
  /// position, (x, r, gamma[, beta]) -> (the sum, the norm): the residual
  /// stream's sum and the next block's norm in one pass. Maps the norm to
  /// the add, which is skipped.
  DenseMap<Operation *, Operation *> normOfAdd;
  /// An add of a layer_norm_grad_input's (rms_norm_grad_input's) result
  /// used only there, with no adamw in between (gamma unchanged): one
  /// `layer_norm_grad_input_add` (`rms_norm_grad_input_add`) kernel at the
  /// add's position, (x, gamma, dy, the other addend) -> the sum. Maps the
  /// add to the grad_input, which is skipped.
  DenseMap<Operation *, Operation *> normGradOfAdd;

  /// Whether `op`'s kernel is merged into another op's.
  bool absorbed(Operation *op) const { return merged.count(op) != 0; }
  /// Every merged op, to the op whose kernel runs it.
  DenseMap<Operation *, Operation *> merged;
};

/// The fusions of a segment's body: none unless `fuse` (piperc's
/// --no-fused-epilogues turns them off).
SegmentFusions findSegmentFusions(Block &body, bool fuse);

/// How the lowering names values: `operandOf` the plan operand of a value
/// it has met (failure for another), `newValue` a new plan value for a
/// result.
struct PlanValues {
  llvm::function_ref<FailureOr<::piper::plan::Operand>(Value)> operandOf;
  llvm::function_ref<::piper::plan::Operand(Value)> newValue;
};

/// When `op`'s position runs a fused kernel of a whole op it absorbed
/// (linear_grad_input_gelu, add_layer_norm, add_rms_norm,
/// *_norm_grad_input_add), fills `k`'s name and operands and returns the op
/// whose attributes the kernel takes (the linear_grad_input, the norm, the
/// norm's grad_input: setKernelAttributes); else returns null and leaves
/// `k` alone. Fails on a value the lowering does not know.
FailureOr<Operation *> lowerFusedKernel(Operation &op,
                                        const SegmentFusions &fusions,
                                        const PlanValues &values,
                                        ::piper::plan::Kernel &k);

} // namespace mlir::piper

#endif // PIPER_COMPILER_LOWERING_SEGMENTFUSIONS_H
