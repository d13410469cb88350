// Gradient rules of the forward compute ops (DifferentiableOpInterface).
#include "dialects/piper/Gradients.h"

#include "dialects/piper/PiperDialect.h"

using namespace mlir;
using namespace mlir::piper;

GradientEmitter::~GradientEmitter() = default;

// A residual becomes a backward argument when it is first saved, so the order
// of `getSaved` calls is the order of the backward's arguments. Rules that
// save several operands save them last operand first: the order piper's
// backward segments have always had.

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingOp::emitInputGradients(OpBuilder &, GradientEmitter &) {
  return success(); // token ids have no gradient
}

LogicalResult EmbeddingOp::emitWeightGradients(OpBuilder &b,
                                               GradientEmitter &g) {
  if (g.needsGrad(getTable()))
    g.addGrad(b, getTable(),
              EmbeddingGradOp::create(
                  b, getLoc(), getTable().getType(), g.getSaved(b, getIds()),
                  g.getGrad(getResult()), getMembersAttr()));
  return success();
}

LogicalResult PositionAddOp::emitInputGradients(OpBuilder &b,
                                                GradientEmitter &g) {
  if (g.needsGrad(getInput()))
    g.addGrad(b, getInput(), g.getGrad(getResult()));
  return success();
}

LogicalResult PositionAddOp::emitWeightGradients(OpBuilder &b,
                                                 GradientEmitter &g) {
  if (g.needsGrad(getPos()))
    g.addGrad(b, getPos(),
              PositionAddGradOp::create(b, getLoc(), getPos().getType(),
                                        g.getGrad(getResult()), getSeqAttr(),
                                        getCpAttr()));
  return success();
}

//===----------------------------------------------------------------------===//
// Dense layers and normalization
//===----------------------------------------------------------------------===//

LogicalResult LinearOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  if (g.needsGrad(getInput()))
    g.addGrad(b, getInput(),
              LinearGradInputOp::create(
                  b, getLoc(), getInput().getType(), g.getGrad(getResult()),
                  g.getSaved(b, getWeight()), getTransposeW()));
  return success();
}

LogicalResult LinearOp::emitWeightGradients(OpBuilder &b, GradientEmitter &g) {
  Value dy = g.getGrad(getResult());
  if (getBias() && g.needsGrad(getWeight()) && g.needsGrad(getBias()) &&
      g.fusesEpilogues()) {
    auto both = LinearGradWeightBiasOp::create(
        b, getLoc(), getWeight().getType(), getBias().getType(),
        g.getSaved(b, getInput()), dy, getTransposeW());
    g.addGrad(b, getWeight(), both.getResult());
    g.addGrad(b, getBias(), both.getBiasGrad());
    return success();
  }
  if (g.needsGrad(getWeight()))
    g.addGrad(b, getWeight(),
              LinearGradWeightOp::create(b, getLoc(), getWeight().getType(),
                                         g.getSaved(b, getInput()), dy,
                                         getTransposeW()));
  if (getBias() && g.needsGrad(getBias()))
    g.addGrad(b, getBias(),
              BiasGradOp::create(b, getLoc(), getBias().getType(), dy));
  return success();
}

LogicalResult BiasAddOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  if (g.needsGrad(getInput()))
    g.addGrad(b, getInput(), g.getGrad(getResult()));
  return success();
}

LogicalResult BiasAddOp::emitWeightGradients(OpBuilder &b, GradientEmitter &g) {
  if (g.needsGrad(getBias()))
    g.addGrad(b, getBias(),
              BiasGradOp::create(b, getLoc(), getBias().getType(),
                                 g.getGrad(getResult())));
  return success();
}

LogicalResult LayerNormOp::emitInputGradients(OpBuilder &b,
                                              GradientEmitter &g) {
  if (!g.needsGrad(getInput()))
    return success();
  Value gamma = g.getSaved(b, getGamma());
  Value input = g.getSaved(b, getInput());
  g.addGrad(b, getInput(),
            LayerNormGradInputOp::create(b, getLoc(), getInput().getType(),
                                         input, gamma, g.getGrad(getResult()),
                                         getEpsAttr()));
  return success();
}

LogicalResult LayerNormOp::emitWeightGradients(OpBuilder &b,
                                               GradientEmitter &g) {
  bool gamma = g.needsGrad(getGamma()), beta = g.needsGrad(getBeta());
  if (!gamma && !beta)
    return success();
  auto grads = LayerNormGradWeightOp::create(
      b, getLoc(), getGamma().getType(), getBeta().getType(),
      g.getSaved(b, getInput()), g.getGrad(getResult()), getEpsAttr());
  if (gamma)
    g.addGrad(b, getGamma(), grads.getDgamma());
  if (beta)
    g.addGrad(b, getBeta(), grads.getDbeta());
  return success();
}

LogicalResult RmsNormOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  if (!g.needsGrad(getInput()))
    return success();
  Value gamma = g.getSaved(b, getGamma());
  Value input = g.getSaved(b, getInput());
  g.addGrad(b, getInput(),
            RmsNormGradInputOp::create(b, getLoc(), getInput().getType(), input,
                                       gamma, g.getGrad(getResult()),
                                       getEpsAttr()));
  return success();
}

LogicalResult RmsNormOp::emitWeightGradients(OpBuilder &b, GradientEmitter &g) {
  if (g.needsGrad(getGamma()))
    g.addGrad(b, getGamma(),
              RmsNormGradWeightOp::create(
                  b, getLoc(), getGamma().getType(), g.getSaved(b, getInput()),
                  g.getGrad(getResult()), getEpsAttr()));
  return success();
}

LogicalResult QkNormOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  if (!g.needsGrad(getQkv()))
    return success();
  Value gamma = g.getSaved(b, getGamma());
  Value qkv = g.getSaved(b, getQkv());
  g.addGrad(b, getQkv(),
            QkNormGradInputOp::create(b, getLoc(), getQkv().getType(), qkv,
                                      gamma, g.getGrad(getResult()),
                                      getHeadsAttr(), getKvHeadsAttr(),
                                      getEpsAttr()));
  return success();
}

LogicalResult QkNormOp::emitWeightGradients(OpBuilder &b, GradientEmitter &g) {
  if (g.needsGrad(getGamma()))
    g.addGrad(b, getGamma(),
              QkNormGradWeightOp::create(b, getLoc(), getGamma().getType(),
                                         g.getSaved(b, getQkv()),
                                         g.getGrad(getResult()), getHeadsAttr(),
                                         getKvHeadsAttr(), getEpsAttr()));
  return success();
}

//===----------------------------------------------------------------------===//
// Elementwise ops and attention
//===----------------------------------------------------------------------===//

LogicalResult GeluOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  g.addGrad(b, getInput(),
            GeluGradOp::create(b, getLoc(), g.getSaved(b, getInput()),
                               g.getGrad(getResult())));
  return success();
}

LogicalResult AddOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  Value dy = g.getGrad(getResult());
  if (g.needsGrad(getLhs()))
    g.addGrad(b, getLhs(), dy);
  if (g.needsGrad(getRhs()))
    g.addGrad(b, getRhs(), dy);
  return success();
}

LogicalResult SwigluOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  g.addGrad(b, getInput(),
            SwigluGradOp::create(b, getLoc(), getInput().getType(),
                                 g.getSaved(b, getInput()),
                                 g.getGrad(getResult())));
  return success();
}

LogicalResult AttentionOp::emitInputGradients(OpBuilder &b,
                                              GradientEmitter &g) {
  // From the forward's q|k|v, output and softmax statistics (lse).
  Value dy = g.getGrad(getResult());
  if (!dy || !g.needsGrad(getQkv()))
    return success();
  g.addGrad(b, getQkv(),
            AttentionGradOp::create(
                b, getLoc(), getQkv().getType(), g.getSaved(b, getQkv()),
                g.getSaved(b, getResult()), g.getSaved(b, getLse()), dy,
                getHeadsAttr(), getSeqAttr(), getKvHeadsAttr(),
                getRopeThetaAttr(), getRopeScalingAttr()));
  return success();
}

LogicalResult CpAttentionOp::emitInputGradients(OpBuilder &b,
                                                GradientEmitter &g) {
  // The ring backward recomputes each block's scores from q|k|v and the
  // forward's output and log-sum-exp (the key/value shards are never
  // kept).
  Value dy = g.getGrad(getResult());
  if (!dy || !g.needsGrad(getQkv()))
    return success();
  g.addGrad(b, getQkv(),
            CpAttentionGradOp::create(
                b, getLoc(), getQkv().getType(), g.getSaved(b, getQkv()),
                g.getSaved(b, getResult()), g.getSaved(b, getLse()), dy,
                getHeadsAttr(), getSeqAttr(), getKvHeadsAttr(),
                getRopeThetaAttr(), getCpAttr(), getRopeScalingAttr()));
  return success();
}

// Ulysses: each all-to-all's gradient is the other (a permutation of
// rows and columns, whose adjoint is its inverse).
template <typename Dual, typename Op>
static LogicalResult ulyssesDualGradient(Op op, OpBuilder &b,
                                         GradientEmitter &g) {
  if (!g.needsGrad(op.getInput()))
    return success();
  g.addGrad(b, op.getInput(),
            Dual::create(b, op.getLoc(), op.getInput().getType(),
                         g.getGrad(op.getResult()), op.getCpAttr(),
                         op.getSeqAttr(), op.getHeadsAttr(),
                         op.getKvHeadsAttr()));
  return success();
}

LogicalResult CpSeqToHeadsOp::emitInputGradients(OpBuilder &b,
                                                 GradientEmitter &g) {
  return ulyssesDualGradient<CpHeadsToSeqOp>(*this, b, g);
}
LogicalResult CpHeadsToSeqOp::emitInputGradients(OpBuilder &b,
                                                 GradientEmitter &g) {
  return ulyssesDualGradient<CpSeqToHeadsOp>(*this, b, g);
}

// MoE layers under context parallelism: the gather's gradient sums the
// members' gradients of the whole sequence and keeps the member's rows;
// the split's puts the member's rows back, zeros elsewhere.
LogicalResult CpGatherOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  if (g.needsGrad(getInput()))
    g.addGrad(b, getInput(),
              CpGatherGradOp::create(b, getLoc(), getInput().getType(),
                                     g.getGrad(getResult()), getCpAttr(),
                                     getSeqAttr()));
  return success();
}
LogicalResult CpSplitOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  if (g.needsGrad(getInput()))
    g.addGrad(b, getInput(),
              CpSplitGradOp::create(b, getLoc(), getInput().getType(),
                                    g.getGrad(getResult()), getCpAttr(),
                                    getSeqAttr()));
  return success();
}

//===----------------------------------------------------------------------===//
// Tensor parallelism: Megatron's f and g
//===----------------------------------------------------------------------===//

LogicalResult TpCopyOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  if (!g.needsGrad(getInput()))
    return success();
  g.addGrad(b, getInput(),
            TpReduceOp::create(b, getLoc(), g.getGrad(getResult())));
  return success();
}

LogicalResult TpReduceOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  if (g.needsGrad(getInput()))
    g.addGrad(b, getInput(), g.getGrad(getResult()));
  return success();
}

// Sequence parallelism: each row op's gradient is its dual.
template <typename Dual, typename Op>
static LogicalResult spDualGradient(Op op, OpBuilder &b, GradientEmitter &g) {
  if (!g.needsGrad(op.getInput()))
    return success();
  g.addGrad(b, op.getInput(),
            Dual::create(b, op.getLoc(), op.getInput().getType(),
                         g.getGrad(op.getResult()), op.getMembersAttr()));
  return success();
}

LogicalResult SpAllGatherOp::emitInputGradients(OpBuilder &b,
                                                GradientEmitter &g) {
  return spDualGradient<SpReduceScatterOp>(*this, b, g);
}
LogicalResult SpReduceScatterOp::emitInputGradients(OpBuilder &b,
                                                    GradientEmitter &g) {
  return spDualGradient<SpAllGatherOp>(*this, b, g);
}
LogicalResult SpSplitOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  return spDualGradient<SpGatherOp>(*this, b, g);
}
LogicalResult SpGatherOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  return spDualGradient<SpSplitOp>(*this, b, g);
}

// Replicated key/value heads: column copies and the assembly of a head.
LogicalResult ColumnsOp::emitInputGradients(OpBuilder &b, GradientEmitter &g) {
  if (g.needsGrad(getInput()))
    g.addGrad(b, getInput(),
              ColumnsGradOp::create(b, getLoc(), getInput().getType(),
                                    g.getGrad(getResult()), getStartAttr()));
  return success();
}

LogicalResult TpKvAssembleOp::emitInputGradients(OpBuilder &b,
                                                 GradientEmitter &g) {
  Value dy = g.getGrad(getResult());
  if (g.needsGrad(getWeight())) {
    auto w = cast<RankedTensorType>(getWeight().getType());
    auto query = RankedTensorType::get(
        {w.getDimSize(0), static_cast<int64_t>(getQuery())},
        w.getElementType());
    Value dq =
        ColumnsOp::create(b, getLoc(), query, dy, b.getI64IntegerAttr(0));
    g.addGrad(
        b, getWeight(),
        ColumnsGradOp::create(b, getLoc(), w, dq, b.getI64IntegerAttr(0)));
  }
  if (g.needsGrad(getPieces()))
    g.addGrad(b, getPieces(),
              TpKvAssembleGradOp::create(b, getLoc(), getPieces().getType(), dy,
                                         getMembersAttr(), getQueryAttr()));
  return success();
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

bool CrossEntropyOp::isLoss() { return true; }

LogicalResult CrossEntropyOp::emitInputGradients(OpBuilder &b,
                                                 GradientEmitter &g) {
  // Only the loss a segment returns is a term of the training loss.
  if (!g.isReturnedLoss(getLoss()))
    return success();
  g.accumulateLoss(getLoss(), b.getF64FloatAttr(1.0));
  if (g.fusesInForward(getLogits())) {
    // The fused classifier: the forward computes the loss and the logits'
    // gradient in one pass and keeps the gradient (the same size) instead
    // of the logits. Not when the backward re-runs the logits (recompute):
    // keeping the gradient would keep what the directive recomputes.
    OpBuilder fb(getOperation());
    auto fused = CrossEntropyFusedOp::create(fb, getLoc(), getLoss().getType(),
                                             getLogits().getType(), getLogits(),
                                             getTargets());
    fused->setDiscardableAttrs(getOperation()->getDiscardableAttrDictionary());
    clearRecomputeRegion(fused);
    getLoss().replaceAllUsesWith(fused.getLoss());
    g.eraseFromForward(getOperation());
    g.addGrad(b, getLogits(), g.getSaved(b, fused.getDlogits()));
    return success();
  }
  Value targets = g.getSaved(b, getTargets());
  Value logits = g.getSaved(b, getLogits());
  g.addGrad(b, getLogits(),
            CrossEntropyGradOp::create(b, getLoc(), getLogits().getType(),
                                       logits, targets));
  return success();
}

bool VocabCrossEntropyOp::isLoss() { return true; }

LogicalResult VocabCrossEntropyOp::emitInputGradients(OpBuilder &b,
                                                      GradientEmitter &g) {
  if (!g.isReturnedLoss(getLoss()))
    return success();
  g.accumulateLoss(getLoss(), b.getF64FloatAttr(1.0));
  // The statistics get no gradient: the logits' follows from them directly
  // (their maxima cancel out of the loss, and the sums' and the target's
  // terms are this member's columns of softmax - onehot).
  Value targets = g.getSaved(b, getTargets());
  Value logits = g.getSaved(b, getLogits());
  Value stats = g.getSaved(b, getStats());
  g.addGrad(b, getLogits(),
            VocabCrossEntropyGradOp::create(b, getLoc(), getLogits().getType(),
                                            stats, logits, targets,
                                            getMembersAttr()));
  return success();
}

bool MoeAuxLossOp::isLoss() { return true; }

LogicalResult MoeAuxLossOp::emitInputGradients(OpBuilder &b,
                                               GradientEmitter &g) {
  // Not returned: the load-balancing loss joins the step loss with its weight.
  g.accumulateLoss(getLoss(), getCoeffAttr());
  Value indices = g.getSaved(b, getIndices());
  Value logits = g.getSaved(b, getLogits());
  g.addGrad(b, getLogits(),
            MoeAuxLossGradOp::create(b, getLoc(), getLogits().getType(), logits,
                                     indices, getExpertsAttr(), getTopKAttr(),
                                     getCoeffAttr()));
  return success();
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

LogicalResult MoeRouterOp::emitInputGradients(OpBuilder &b,
                                              GradientEmitter &g) {
  // Only the gate weights carry a gradient; the indices are integers.
  Value dw = g.getGrad(getWeights());
  if (!dw || !g.needsGrad(getLogits()))
    return success();
  Value indices = g.getSaved(b, getIndices());
  Value logits = g.getSaved(b, getLogits());
  g.addGrad(b, getLogits(),
            MoeRouterGradOp::create(b, getLoc(), getLogits().getType(), logits,
                                    indices, dw, getTopKAttr(),
                                    getNormTopkAttr()));
  return success();
}

LogicalResult MoeDispatchOp::emitInputGradients(OpBuilder &b,
                                                GradientEmitter &g) {
  if (g.needsGrad(getInput()))
    g.addGrad(b, getInput(),
              MoeDispatchGradOp::create(b, getLoc(), getInput().getType(),
                                        g.getSaved(b, getIndices()),
                                        g.getGrad(getResult()),
                                        getExpertsAttr(), getCapacityAttr()));
  return success();
}

LogicalResult MoeCombineOp::emitInputGradients(OpBuilder &b,
                                               GradientEmitter &g) {
  // Both are activations: the expert outputs and the router's gate weights.
  Value weights = g.getSaved(b, getWeights());
  Value indices = g.getSaved(b, getIndices());
  Value input = g.getSaved(b, getInput());
  auto grads = MoeCombineGradOp::create(
      b, getLoc(), getInput().getType(), getWeights().getType(), input, indices,
      weights, g.getGrad(getResult()), getExpertsAttr(), getCapacityAttr());
  if (g.needsGrad(getInput()))
    g.addGrad(b, getInput(), grads.getDinput());
  if (g.needsGrad(getWeights()))
    g.addGrad(b, getWeights(), grads.getDweights());
  return success();
}

LogicalResult ExpertLinearOp::emitInputGradients(OpBuilder &b,
                                                 GradientEmitter &g) {
  if (g.needsGrad(getInput()))
    g.addGrad(b, getInput(),
              ExpertLinearGradInputOp::create(
                  b, getLoc(), getInput().getType(), g.getGrad(getResult()),
                  g.getSaved(b, getWeight()), getExpertsAttr()));
  return success();
}

LogicalResult ExpertLinearOp::emitWeightGradients(OpBuilder &b,
                                                  GradientEmitter &g) {
  if (g.needsGrad(getWeight()))
    g.addGrad(b, getWeight(),
              ExpertLinearGradWeightOp::create(
                  b, getLoc(), getWeight().getType(), g.getSaved(b, getInput()),
                  g.getGrad(getResult()), getExpertsAttr()));
  return success();
}
