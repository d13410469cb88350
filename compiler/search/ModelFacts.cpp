// The facts of a model the search reasons with, read from its ops.
#include "compiler/search/Search.h"

#include "compiler/analysis/ProgramInfo.h"
#include "dialects/piper/PiperDialect.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::piper;
using namespace mlir::piper::search;

FailureOr<ModelFacts> search::scanModel(ModuleOp module, std::string &error) {
  ModelFacts f;
  // Expert weights: the parameters an expert_linear multiplies by.
  llvm::StringSet<> expertWeights;
  module.walk([&](ExpertLinearOp op) {
    if (auto ref = op->getOperand(1).getDefiningOp<ParamRefOp>())
      expertWeights.insert(ref.getParam());
  });
  for (auto param : module.getOps<ParamOp>()) {
    auto type = dyn_cast<RankedTensorType>(param.getType());
    if (!type)
      continue;
    (expertWeights.contains(param.getSymName()) ? f.expertParams
                                                : f.denseParams) +=
        type.getNumElements();
  }
  for (auto seg : module.getOps<SegmentOp>()) {
    f.forwardFlops += estimateSegmentCost(seg).flops;
    // The token input: a rank-2 integer argument (batch x sequence).
    for (Type arg : seg.getFunctionType().getInputs())
      if (auto type = dyn_cast<RankedTensorType>(arg);
          type && type.getRank() == 2 && type.getElementType().isInteger() &&
          f.batch == 0) {
        f.batch = type.getDimSize(0);
        f.seq = type.getDimSize(1);
      }
    seg.walk([&](Operation *op) {
      if (auto attention = dyn_cast<AttentionOp>(op)) {
        ++f.layers;
        f.heads = attention.getHeads();
        f.kvHeads = attention.getKvHeads().value_or(f.heads);
        f.attentionFlops += estimateFlops(op);
      } else if (auto embedding = dyn_cast<EmbeddingOp>(op)) {
        auto table = cast<RankedTensorType>(op->getOperand(1).getType());
        f.vocab = table.getDimSize(0);
        f.hidden = table.getDimSize(1);
      } else if (auto dispatch = dyn_cast<MoeDispatchOp>(op)) {
        if (auto experts = op->getAttrOfType<IntegerAttr>("experts"))
          f.experts = experts.getInt();
        f.dispatchRows = dispatch.getType().getDimSize(0);
      }
    });
  }
  if (f.batch <= 0 || f.seq <= 0) {
    error = "the model has no token input (a batch x sequence integer "
            "tensor of a segment): the search needs its microbatch size";
    return failure();
  }
  if (f.layers == 0 || f.hidden == 0) {
    error = "the model has no attention or embedding op: the search "
            "reasons about transformer language models";
    return failure();
  }
  return f;
}
