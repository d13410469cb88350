// The context a gradient rule (DifferentiableOpInterface) builds in.
#ifndef PIPER_DIALECTS_PIPER_GRADIENTS_H
#define PIPER_DIALECTS_PIPER_GRADIENTS_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Value.h"

namespace mlir::piper {

/// What a gradient rule sees of the reverse-mode differentiation of a
/// segment (piper-build-training-dag implements it). Values named here are
/// forward values; a rule builds its gradient ops into the backward segment
/// with the OpBuilder it is handed and gives back the gradients of its
/// operands with `addGrad`.
class GradientEmitter {
public:
  virtual ~GradientEmitter();

  /// The gradient flowing back into forward value `result`, or null when
  /// nothing downstream of it reaches a loss.
  virtual Value getGrad(Value result) = 0;

  /// Whether forward value `v` depends on something trainable (a float
  /// segment argument or a parameter), so that its gradient is wanted.
  virtual bool needsGrad(Value v) = 0;

  /// Forward value `v` as the backward sees it: a parameter is read again
  /// with `param_ref`; anything else is a residual the forward keeps for
  /// the backward (a segment argument is passed along, any other value
  /// becomes a forward result).
  virtual Value getSaved(OpBuilder &b, Value v) = 0;

  /// Adds `grad` to the gradient of forward value `v` (a `piper.add` when
  /// `v` already has one). The gradient of a `param_ref` result ends in one
  /// `piper.accumulate_grad` of its parameter, emitted by the pass.
  virtual void addGrad(OpBuilder &b, Value v, Value grad) = 0;

  /// Whether scalar `loss` is a loss the segment returns.
  virtual bool isReturnedLoss(Value loss) = 0;

  /// Makes forward value `loss`, times `weight`, a term of the step loss
  /// (a `piper.loss_accumulate` right after it in the forward). The
  /// gradient of a loss is the microbatch's loss seed, which the runtime
  /// gives the loss's gradient op; it has no `getGrad`.
  virtual void accumulateLoss(Value loss, FloatAttr weight) = 0;

  /// Whether a loss's rule may compute the gradient of forward value `v` in
  /// the forward (the fused classifier): the pass fuses, and the backward
  /// would keep `v` rather than re-run its op (a recompute region).
  virtual bool fusesInForward(Value v) = 0;

  /// Whether a rule may emit one op for gradients a GEMM epilogue computes
  /// together (a biased linear's weight and bias gradients,
  /// `linear_grad_weight_bias`), instead of one op each.
  virtual bool fusesEpilogues() = 0;

  /// Erases forward op `op`, which a rule has replaced (its results have
  /// no uses left), once the whole segment is differentiated.
  virtual void eraseFromForward(Operation *op) = 0;
};

} // namespace mlir::piper

#endif // PIPER_DIALECTS_PIPER_GRADIENTS_H
