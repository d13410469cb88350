// The piper dialect: C++ declarations generated from ODS plus helpers.
#ifndef PIPER_DIALECTS_PIPER_PIPERDIALECT_H
#define PIPER_DIALECTS_PIPER_PIPERDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/RegionKindInterface.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/CallInterfaces.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/piper/PiperEnums.h.inc"
#include "mlir/IR/DialectImplementation.h"
#include "support/ParallelLayout.h"

namespace mlir {
/// Parses a double-precision parameter of an attribute's `struct(params)`
/// format (MLIR ships integer, string and attribute field parsers only).
template <> struct FieldParser<llvm::APFloat> {
  static FailureOr<llvm::APFloat> parse(AsmParser &parser) {
    double value = 0;
    if (parser.parseFloat(value))
      return failure();
    return llvm::APFloat(value);
  }
};
} // namespace mlir

#define GET_TYPEDEF_CLASSES
#include "dialects/piper/PiperTypes.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/piper/PiperAttrs.h.inc"

// After the attributes: the dialect's discardable-attribute helpers use them.
#include "dialects/piper/PiperDialect.h.inc"

namespace mlir::piper {
/// Elements of every tensor result of `op`: the default FLOP count of
/// CostOpInterface.
double countResultElements(Operation *op);
/// Bytes of every tensor operand and result of `op`: the default bytes moved
/// of CostOpInterface.
double countTensorBytes(Operation *op);
/// The context a gradient rule builds in (Gradients.h).
class GradientEmitter;
/// The program node a segment collective (SegmentCollectiveOpInterface)
/// becomes.
enum class SegmentCollectiveKind {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  RingShift,
};
} // namespace mlir::piper

#include "dialects/piper/PiperInterfaces.h.inc"

namespace mlir::OpTrait::piper {
/// Marks an op that computes the gradient of a parameter from activations
/// (a weight gradient, e.g. linear_grad_weight): with the gradient
/// accumulations it uses, what a split backward defers to its BW half.
template <typename ConcreteType>
class WeightGradient : public TraitBase<ConcreteType, WeightGradient> {};
} // namespace mlir::OpTrait::piper

#define GET_OP_CLASSES
#include "dialects/piper/PiperOps.h.inc"

namespace mlir::piper {

/// Checks a device group: non-empty, non-negative, no repeats.
LogicalResult
verifyDeviceGroup(llvm::ArrayRef<int64_t> devices, llvm::StringRef what,
                  llvm::function_ref<InFlightDiagnostic()> emitError);

/// The rows of each member's slice when `rows` rows are split over
/// `members` (reduce-scatter, all-gather): balanced and in order, member i
/// holding rows / members rows plus one when i < rows % members
/// (support/BalancedSplit.h, the rule of ZeRO shards too).
llvm::SmallVector<int64_t> balancedSlices(int64_t rows, int64_t members);

/// The declared discardable attributes of a segment (PiperDialect's
/// `discardableAttrs`): `piper.pass`, the pass it runs, and `piper.block`,
/// the model region it came from (nullopt when absent).
void setSegmentPass(Operation *segment, PassKind pass);
void setModelBlock(Operation *segment, int64_t block);
std::optional<int64_t> getModelBlock(Operation *segment);

/// The declared discardable attribute of a forward op, `piper.recompute`:
/// the recompute region (model block) it belongs to, whose results the
/// backward recomputes instead of keeping (nullopt when absent).
void setRecomputeRegion(Operation *op, int64_t region);
std::optional<int64_t> getRecomputeRegion(Operation *op);
void clearRecomputeRegion(Operation *op);

/// The one parallel layout (support/ParallelLayout.h), for the passes.
using ::piper::Axis;
using ::piper::Degrees;
using ::piper::ParallelLayout;

/// The module's #piper.mesh (tp = cp = 1 when absent): the degrees of tensor
/// and context parallelism, which `shard_tensor` and `context_parallel` set.
MeshAttr getMesh(Operation *module);

/// `shard_tensor`'s module attributes: the mesh's tp and the stream of its
/// all-reduces.
void setTensorParallel(Operation *module, int64_t members,
                       llvm::StringRef stream);
llvm::StringRef getTensorParallelStream(Operation *module);

/// `context_parallel`'s module attributes: the mesh's cp, the stream of its
/// ring exchanges and whether they run beside the ring steps (true when
/// absent).
void setContextParallel(Operation *module, int64_t members,
                        llvm::StringRef stream, bool overlap = true);
llvm::StringRef getContextParallelStream(Operation *module);
bool getContextParallelOverlap(Operation *module);

/// The declared discardable attribute of a parameter that sequence
/// parallelism reads on each member's rows (its gradient is partial over
/// the tensor-parallel group).
void setSequencePartial(Operation *param);
bool isSequencePartial(Operation *param);

/// The declared discardable attribute of a parameter built from a Hugging
/// Face checkpoint: the tensors it is made of, in placement order (none:
/// not from one).
void setHfSources(Operation *param, llvm::ArrayRef<HfSourceAttr> sources);
llvm::SmallVector<HfSourceAttr> getHfSources(Operation *param);

/// The declared discardable attribute of a module built from a Hugging Face
/// config.json: its text ("" when absent).
void setHfConfig(Operation *module, llvm::StringRef json);
llvm::StringRef getHfConfig(Operation *module);

} // namespace mlir::piper

#endif // PIPER_DIALECTS_PIPER_PIPERDIALECT_H
