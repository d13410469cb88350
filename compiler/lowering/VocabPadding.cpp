// The vocabulary padding of the lowering to plans (VocabPadding.h).
#include "compiler/lowering/VocabPadding.h"

#include "dialects/piper/PiperDialect.h"
#include "proto/KernelIds.h"

using namespace mlir;
using namespace mlir::piper;

namespace {
// Whether `list` (a kernel's padded operand positions, KernelIds.h) has i.
bool hasPosition(const std::vector<int> &list, unsigned i) {
  return llvm::is_contained(list, static_cast<int>(i));
}

// The padded form of `op`'s kernel (the op's name is its kernel's when no
// fusion merged it into another), or null.
const ::piper::plan::PaddedOperands *paddedForm(Operation *op,
                                                const SegmentFusions &fusions) {
  if (fusions.absorbed(op))
    return nullptr;
  return ::piper::plan::findPaddedOperands(op->getName().stripDialect().str());
}

// Whether `r` comes from a kernel that can write it padded: not a biased
// linear, nor one whose kernel is linear_gelu.
bool writesPadded(OpResult r, const SegmentFusions &fusions) {
  Operation *op = r.getOwner();
  if (auto linear = dyn_cast<LinearOp>(op);
      linear && (linear.getBias() || fusions.geluAfter.count(op)))
    return false;
  const auto *form = paddedForm(op, fusions);
  return form && hasPosition(form->outputs, r.getResultNumber());
}

// Whether `use` is an operand a kernel can read padded.
bool readsPadded(OpOperand &use, const SegmentFusions &fusions) {
  const auto *form = paddedForm(use.getOwner(), fusions);
  return form && hasPosition(form->inputs, use.getOperandNumber());
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
