// The vocabulary padding of the lowering to plans (docs/kernels.md, "Padded
// vocabulary"): a classifier's logits and their gradient stored with rows
// padded to a multiple of 64 elements, so that every row of the largest
// GEMM operands of a language model starts aligned (GPT-2's 50257 columns
// otherwise leave the rows 4-byte aligned, which rules out cuBLASLt's best
// kernels). The parameters keep their shapes; the padded columns are never
// read or written, so the numbers are the unpadded plan's.
#ifndef PIPER_COMPILER_LOWERING_VOCABPADDING_H
#define PIPER_COMPILER_LOWERING_VOCABPADDING_H

#include "compiler/lowering/SegmentFusions.h"

#include "mlir/IR/Block.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::piper {

/// What one segment's lowering pads.
struct VocabPadding {
  /// Each padded value (a segment-local [rows, V] value), to its padded
  /// last dimension.
  DenseMap<Value, int64_t> width;
  /// Each op whose kernel reads or writes a padded value, to the valid
  /// columns V (its kernel's `valid_cols`).
  DenseMap<Operation *, int64_t> validCols;
};

/// The values of `body` to pad to a multiple of `multiple` columns (none if
/// `multiple` <= 1): a result whose columns are not a multiple already,
/// written and read (at least once) only at operands with a padded form
/// (proto/KernelIds.h's findPaddedOperands: a bias-free linear's y,
/// cross_entropy_grad's and cross_entropy_fused's dlogits; the loss
/// kernels' logits, linear_grad_input's and linear_grad_weight's dy), by
/// kernels no fusion (`fusions`) merged into another or changed (a linear
/// whose kernel is linear_gelu). Segment arguments and results are never
/// padded: step buffers are dense (the plan validator checks it).
VocabPadding findVocabPadding(Block &body, const SegmentFusions &fusions,
                              int64_t multiple);

} // namespace mlir::piper

#endif // PIPER_COMPILER_LOWERING_VOCABPADDING_H
