// The vocabulary padding of the lowering to plans (VocabPadding.h).
#include "compiler/lowering/VocabPadding.h"

#include "dialects/piper/PiperDialect.h"

using namespace mlir;
using namespace mlir::piper;

namespace {
// Whether `r` comes from a kernel that can write it padded.
bool writesPadded(OpResult r, const SegmentFusions &fusions) {
  Operation *op = r.getOwner();
  if (fusions.absorbed(op))
    return false;
  if (auto linear = dyn_cast<LinearOp>(op))
    return !linear.getBias() && !fusions.geluAfter.count(op);
  if (isa<CrossEntropyGradOp>(op))
    return true;
  return isa<CrossEntropyFusedOp>(op) && r.getResultNumber() == 1;
}

// Whether `use` is an operand a kernel can read padded.
bool readsPadded(OpOperand &use, const SegmentFusions &fusions) {
  Operation *op = use.getOwner();
  if (fusions.absorbed(op))
    return false;
  const unsigned i = use.getOperandNumber();
  if (isa<CrossEntropyOp, CrossEntropyGradOp, CrossEntropyFusedOp,
          LinearGradInputOp>(op))
    return i == 0; // the logits; linear_grad_input's dy
  return isa<LinearGradWeightOp>(op) && i == 1; // dy
}
} // namespace

VocabPadding mlir::piper::findVocabPadding(Block &body,
                                           const SegmentFusions &fusions,
                                           int64_t multiple) {
  VocabPadding out;
  if (multiple <= 1)
    return out;
  for (Operation &op : body) {
    for (OpResult r : op.getResults()) {
      auto type = dyn_cast<RankedTensorType>(r.getType());
      if (!type || type.getRank() != 2 || !type.hasStaticShape() ||
          r.use_empty() || !writesPadded(r, fusions))
        continue;
      const int64_t cols = type.getDimSize(1);
      const int64_t padded = (cols + multiple - 1) / multiple * multiple;
      if (cols == 0 || padded == cols ||
          !llvm::all_of(r.getUses(), [&](OpOperand &use) {
            return readsPadded(use, fusions);
          }))
        continue;
      out.width[r] = padded;
      out.validCols[&op] = cols;
      for (OpOperand &use : r.getUses())
        out.validCols[use.getOwner()] = cols;
    }
  }
  return out;
}
