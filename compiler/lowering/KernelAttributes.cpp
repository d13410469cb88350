// The plan kernel attributes of a compute op (KernelAttributes.h).
#include "compiler/lowering/KernelAttributes.h"

#include "dialects/piper/PiperDialect.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::piper;

void mlir::piper::setKernelAttributes(Operation &op, double lossScale,
                                      int64_t tp, ::piper::plan::Kernel &k) {
  auto setInt = [&](StringRef key, int64_t v) {
    (*k.mutable_attrs())[key.str()].set_i(v);
  };
  auto setFloat = [&](StringRef key, double v) {
    (*k.mutable_attrs())[key.str()].set_f(v);
  };
  for (NamedAttribute a : op.getAttrs()) {
    if (auto i = dyn_cast<IntegerAttr>(a.getValue()))
      setInt(a.getName().getValue(), i.getInt());
    else if (auto f = dyn_cast<FloatAttr>(a.getValue()))
      setFloat(a.getName().getValue(), f.getValueAsDouble());
    else if (isa<UnitAttr>(a.getValue()))
      setInt(a.getName().getValue(), 1);
    else if (auto r = dyn_cast<RopeScalingAttr>(a.getValue())) {
      // Llama 3.1's frequencies: the kernels' rope_* attributes.
      setFloat("rope_factor", r.getFactor().convertToDouble());
      setFloat("rope_low_freq_factor", r.getLowFreqFactor().convertToDouble());
      setFloat("rope_high_freq_factor",
               r.getHighFreqFactor().convertToDouble());
      setInt("rope_original_max_position", r.getOriginalMaxPosition());
    }
  }
  // Attributes with defaults are not stored on the op: the norms' eps.
  llvm::TypeSwitch<Operation *>(&op)
      .Case<LayerNormOp, LayerNormGradInputOp, LayerNormGradWeightOp, RmsNormOp,
            RmsNormGradInputOp, RmsNormGradWeightOp, QkNormOp,
            QkNormGradInputOp, QkNormGradWeightOp>(
          [&](auto norm) { setFloat("eps", norm.getEps().convertToDouble()); });
  if (auto eg = dyn_cast<EmbeddingGradOp>(op)) {
    setInt("vocab",
           cast<RankedTensorType>(eg.getResult().getType()).getDimSize(0));
  }
  // The loss seed 1 / (microbatches * replicas), times the term's weight.
  if (isa<CrossEntropyGradOp, CrossEntropyFusedOp, VocabCrossEntropyGradOp>(op))
    setFloat("scale", lossScale);
  // Every member of a tensor-parallel group computes the same loss:
  // the reported sum over ranks counts it once.
  if (auto acc = dyn_cast<LossAccumulateOp>(op))
    setFloat("scale",
             lossScale * acc.getCoeff().convertToDouble() / double(tp));
  if (auto aux = dyn_cast<MoeAuxLossGradOp>(op))
    setFloat("scale", lossScale * aux.getCoeff().convertToDouble());
  if (isa<MoeRouterOp, MoeRouterGradOp>(op))
    setInt("norm_topk", op.hasAttr("norm_topk") ? 1 : 0);
}
