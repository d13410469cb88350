// The kernel fusions of a segment (SegmentFusions.h).
#include "compiler/lowering/SegmentFusions.h"

#include "dialects/piper/PiperDialect.h"

using namespace mlir;
using namespace mlir::piper;

namespace {

void findAccumulations(Block &body, SegmentFusions &f) {
  for (AccumulateGradOp acc : body.getOps<AccumulateGradOp>()) {
    Value g = acc.getGrad();
    Operation *def = g.getDefiningOp();
    if (!def || def->getBlock() != &body || !g.hasOneUse() ||
        g != def->getResult(0) ||
        !isa<LinearGradWeightOp, LinearGradWeightBiasOp>(def))
      continue;
    StringAttr name = acc.getParamAttr().getAttr();
    bool named = false;
    for (Operation *o = def->getNextNode(); o && o != acc.getOperation();
         o = o->getNextNode())
      if (auto ref = o->getAttrOfType<FlatSymbolRefAttr>("param"))
        named |= ref.getAttr() == name;
    if (named)
      continue;
    f.accumulatesInto[def] = acc.getOperation();
    f.merged[acc.getOperation()] = def;
  }
}

void findGelus(Block &body, SegmentFusions &f) {
  // linear + gelu: the first gelu of a linear's result.
  for (GeluOp gelu : body.getOps<GeluOp>()) {
    auto linear = gelu.getInput().getDefiningOp<LinearOp>();
    if (!linear || linear->getBlock() != &body ||
        f.geluAfter.count(linear.getOperation()))
      continue;
    f.geluAfter[linear.getOperation()] = gelu.getOperation();
    f.merged[gelu.getOperation()] = linear.getOperation();
  }
  // linear_grad_input + gelu_grad: the product's one use, the weight
  // unchanged until the gelu_grad (no adamw between them).
  for (GeluGradOp grad : body.getOps<GeluGradOp>()) {
    Value product = grad.getGrad();
    auto gi = product.getDefiningOp<LinearGradInputOp>();
    if (!gi || gi->getBlock() != &body || !product.hasOneUse())
      continue;
    bool updates = false;
    for (Operation *o = gi->getNextNode(); o && o != grad.getOperation();
         o = o->getNextNode())
      updates |= isa<AdamWOp>(o);
    if (updates)
      continue;
    f.geluGradOf[grad.getOperation()] = gi.getOperation();
    f.merged[gi.getOperation()] = grad.getOperation();
  }
}

} // namespace

SegmentFusions mlir::piper::findSegmentFusions(Block &body, bool fuse) {
  SegmentFusions f;
  if (!fuse)
    return f;
  findAccumulations(body, f);
  findGelus(body, f);
  return f;
}
