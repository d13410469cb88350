// The kernel fusions of a segment (SegmentFusions.h).
#include "compiler/lowering/SegmentFusions.h"

#include "dialects/piper/PiperDialect.h"

using namespace mlir;
using namespace mlir::piper;
namespace plan = ::piper::plan;

namespace {

// Whether an op strictly between `from` and `to` (in one block) satisfies
// `pred`.
template <typename Pred>
bool anyBetween(Operation *from, Operation *to, Pred pred) {
  for (Operation *o = from->getNextNode(); o && o != to; o = o->getNextNode())
    if (pred(o))
      return true;
  return false;
}

// The accumulate_grad that alone reads `v` (a result of `def`), with no op
// between the two naming its parameter; null if there is none.
Operation *soleAccumulation(Value v, Operation *def, Block &body) {
  if (!v.hasOneUse())
    return nullptr;
  auto acc = dyn_cast<AccumulateGradOp>(*v.getUsers().begin());
  if (!acc || acc->getBlock() != &body)
    return nullptr;
  StringAttr name = acc.getParamAttr().getAttr();
  if (anyBetween(def, acc, [&](Operation *o) {
        auto ref = o->getAttrOfType<FlatSymbolRefAttr>("param");
        return ref && ref.getAttr() == name;
      }))
    return nullptr;
  return acc;
}

void findAccumulations(Block &body, SegmentFusions &f) {
  for (Operation &def : body) {
    // The results the kernel's `accumulate` adds: a linear's weight
    // gradient (not linear_grad_weight_bias's bias gradient), an
    // embedding table's, every result of a norm's weight gradient.
    unsigned count = 0;
    if (isa<LinearGradWeightOp, LinearGradWeightBiasOp, EmbeddingGradOp,
            PositionAddGradOp>(def))
      count = 1;
    else if (isa<LayerNormGradWeightOp, RmsNormGradWeightOp>(def))
      count = def.getNumResults();
    else
      continue;
    SmallVector<Operation *, 2> accs(def.getNumResults(), nullptr);
    bool all = true;
    for (unsigned i = 0; i < count && all; ++i)
      all = (accs[i] = soleAccumulation(def.getResult(i), &def, body));
    if (!all)
      continue;
    for (unsigned i = 0; i < count; ++i)
      f.merged[accs[i]] = &def;
    f.accumulatesInto[&def] = accs;
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

void findResidualNorms(Block &body, SegmentFusions &f) {
  // Backward: an add of a norm's input gradient (first, so that an add of
  // both kinds goes to the backward's fusion).
  for (AddOp add : body.getOps<AddOp>()) {
    for (Value v : add->getOperands()) {
      Operation *gi = v.getDefiningOp();
      if (!gi || gi->getBlock() != &body || !v.hasOneUse() ||
          !isa<LayerNormGradInputOp, RmsNormGradInputOp>(gi) ||
          f.absorbed(gi) || f.geluGradOf.count(gi))
        continue;
      if (anyBetween(gi, add, [](Operation *o) { return isa<AdamWOp>(o); }))
        continue;
      f.normGradOfAdd[add.getOperation()] = gi;
      f.merged[gi] = add.getOperation();
      break;
    }
  }
  // Forward: a norm of an add's sum, nothing between them reading it.
  for (Operation &norm : body) {
    if (!isa<LayerNormOp, RmsNormOp>(norm))
      continue;
    Value sum = norm.getOperand(0);
    auto add = sum.getDefiningOp<AddOp>();
    if (!add || add->getBlock() != &body || f.absorbed(add) ||
        f.normGradOfAdd.count(add))
      continue;
    if (anyBetween(add, &norm, [&](Operation *o) {
          return llvm::is_contained(o->getOperands(), sum);
        }))
      continue;
    f.normOfAdd[&norm] = add.getOperation();
    f.merged[add.getOperation()] = &norm;
  }
}

} // namespace

SegmentFusions mlir::piper::findSegmentFusions(Block &body, bool fuse) {
  SegmentFusions f;
  if (!fuse)
    return f;
  findAccumulations(body, f);
  findGelus(body, f);
  findResidualNorms(body, f);
  return f;
}

FailureOr<Operation *>
mlir::piper::lowerFusedKernel(Operation &op, const SegmentFusions &fusions,
                              const PlanValues &values, plan::Kernel &k) {
  auto inputs = [&](ArrayRef<Value> vs) -> LogicalResult {
    for (Value v : vs) {
      FailureOr<plan::Operand> o = values.operandOf(v);
      if (failed(o))
        return op.emitOpError("uses a value the lowering does not know");
      *k.add_inputs() = *o;
    }
    return success();
  };
  auto output = [&](Value v) { *k.add_outputs() = values.newValue(v); };
  if (auto gi =
          dyn_cast_or_null<LinearGradInputOp>(fusions.geluGradOf.lookup(&op))) {
    // linear_grad_input_gelu: (dy, w, h) -> gelu_grad's result.
    auto gelu = cast<GeluGradOp>(op);
    k.set_op("linear_grad_input_gelu");
    if (failed(inputs({gi.getGrad(), gi.getWeight(), gelu.getInput()})))
      return failure();
    output(gelu.getResult());
    return gi.getOperation(); // transpose_w
  }
  if (Operation *add = fusions.normOfAdd.lookup(&op)) {
    // add_layer_norm / add_rms_norm: (x, r, gamma[, beta]) -> (sum, norm).
    k.set_op(isa<LayerNormOp>(op) ? "add_layer_norm" : "add_rms_norm");
    SmallVector<Value> ins(add->getOperands());
    ins.append(std::next(op.operand_begin()), op.operand_end());
    if (failed(inputs(ins)))
      return failure();
    output(add->getResult(0));
    output(op.getResult(0));
    return &op; // eps
  }
  if (Operation *gi = fusions.normGradOfAdd.lookup(&op)) {
    // *_norm_grad_input_add: (x, gamma, dy, the other addend) -> the sum.
    k.set_op(isa<LayerNormGradInputOp>(gi) ? "layer_norm_grad_input_add"
                                           : "rms_norm_grad_input_add");
    Value other = op.getOperand(0) == gi->getResult(0) ? op.getOperand(1)
                                                       : op.getOperand(0);
    SmallVector<Value> ins(gi->getOperands());
    ins.push_back(other);
    if (failed(inputs(ins)))
      return failure();
    output(op.getResult(0));
    return gi; // eps
  }
  return nullptr;
}
