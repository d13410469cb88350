// The piper dialect: registration, verifiers and custom assembly.
#include "dialects/piper/PiperDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::piper;

#include "dialects/piper/PiperDialect.cpp.inc"
#include "dialects/piper/PiperEnums.cpp.inc"
#include "dialects/piper/PiperInterfaces.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "dialects/piper/PiperTypes.cpp.inc"

void PiperDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "dialects/piper/PiperTypes.cpp.inc"
      >();
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "dialects/piper/PiperOps.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Module-level ops
//===----------------------------------------------------------------------===//

LogicalResult ParamOp::verify() {
  RankedTensorType type = getTensorType();
  if (!type.hasStaticShape())
    return emitOpError("parameter shape must be static, got ") << type;
  if (!type.getElementType().isF32())
    return emitOpError("parameter element type must be f32, got ")
           << type.getElementType();
  if (getScale().convertToDouble() < 0)
    return emitOpError("initializer scale must be non-negative");
  if (TensorSliceAttr slice = getTensorSliceAttr()) {
    if (getExpertMembers())
      return emitOpError("a parameter cannot be both expert blocks and a "
                         "tensor-parallel slice");
    if (slice.getDim() >= type.getRank())
      return emitOpError("tensor_slice dim ")
             << slice.getDim() << " is not a dimension of " << type;
    int64_t local = type.getDimSize(slice.getDim()), sum = 0;
    for (int64_t part : slice.getParts())
      sum += part;
    if (!slice.getParts().empty() && sum != local * slice.getMembers())
      return emitOpError("tensor_slice parts sum to ")
             << sum << ", not " << slice.getMembers() << " x " << local;
  }
  return success();
}

void SegmentOp::build(OpBuilder &builder, OperationState &state, StringRef name,
                      FunctionType type) {
  state.addAttribute(SymbolTable::getSymbolAttrName(),
                     builder.getStringAttr(name));
  state.addAttribute(getFunctionTypeAttrName(state.name), TypeAttr::get(type));
  Region *body = state.addRegion();
  Block *block = new Block();
  body->push_back(block);
  for (Type t : type.getInputs())
    block->addArgument(t, state.location);
}

ParseResult SegmentOp::parse(OpAsmParser &parser, OperationState &result) {
  auto buildFuncType =
      [](Builder &builder, ArrayRef<Type> argTypes, ArrayRef<Type> results,
         function_interface_impl::VariadicFlag,
         std::string &) { return builder.getFunctionType(argTypes, results); };
  return function_interface_impl::parseFunctionOp(
      parser, result, /*allowVariadic=*/false,
      getFunctionTypeAttrName(result.name), buildFuncType,
      getArgAttrsAttrName(result.name), getResAttrsAttrName(result.name));
}

void SegmentOp::print(OpAsmPrinter &p) {
  function_interface_impl::printFunctionOp(
      p, *this, /*isVariadic=*/false, getFunctionTypeAttrName(),
      getArgAttrsAttrName(), getResAttrsAttrName());
}

LogicalResult SegmentOp::verify() {
  if (getBody().empty())
    return emitOpError("segment must have a body");
  if (!isa<YieldOp>(getBody().front().back()))
    return emitOpError("segment body must end in piper.yield");
  return success();
}

LogicalResult YieldOp::verify() {
  auto segment = (*this)->getParentOfType<SegmentOp>();
  ArrayRef<Type> expected = segment.getResultTypes();
  if (getValues().size() != expected.size())
    return emitOpError("yields ")
           << getValues().size() << " values but segment @"
           << segment.getSymName() << " returns " << expected.size();
  for (auto [i, pair] :
       llvm::enumerate(llvm::zip(getValues().getTypes(), expected)))
    if (std::get<0>(pair) != std::get<1>(pair))
      return emitOpError("result #")
             << i << " has type " << std::get<0>(pair)
             << " but the segment returns " << std::get<1>(pair);
  return success();
}

/// Looks up parameter `name` from `op`; fails with a diagnostic if missing.
static FailureOr<ParamOp> lookupParam(Operation *op, FlatSymbolRefAttr name,
                                      SymbolTableCollection &symbolTable) {
  auto param = symbolTable.lookupNearestSymbolFrom<ParamOp>(op, name);
  if (!param)
    return op->emitOpError("references unknown parameter ") << name;
  return param;
}

LogicalResult ParamRefOp::verifySymbolUses(SymbolTableCollection &tables) {
  FailureOr<ParamOp> param = lookupParam(*this, getParamAttr(), tables);
  if (failed(param))
    return failure();
  if (param->getType() != getResult().getType())
    return emitOpError("type ")
           << getResult().getType() << " does not match parameter "
           << getParamAttr() << " of type " << param->getType();
  return success();
}

LogicalResult
AccumulateGradOp::verifySymbolUses(SymbolTableCollection &tables) {
  FailureOr<ParamOp> param = lookupParam(*this, getParamAttr(), tables);
  if (failed(param))
    return failure();
  if (param->getType() != getGrad().getType())
    return emitOpError("gradient type ")
           << getGrad().getType() << " does not match parameter "
           << getParamAttr() << " of type " << param->getType();
  return success();
}

LogicalResult AdamWOp::verifySymbolUses(SymbolTableCollection &tables) {
  return lookupParam(*this, getParamAttr(), tables);
}

LogicalResult ZeroGradOp::verifySymbolUses(SymbolTableCollection &tables) {
  return lookupParam(*this, getParamAttr(), tables);
}

//===----------------------------------------------------------------------===//
// Compute ops
//===----------------------------------------------------------------------===//

static int64_t dim(Value v, unsigned i) {
  return cast<RankedTensorType>(v.getType()).getDimSize(i);
}

LogicalResult EmbeddingOp::verify() {
  int64_t rows = dim(getIds(), 0) * dim(getIds(), 1);
  if (dim(getResult(), 0) != rows || dim(getResult(), 1) != dim(getTable(), 1))
    return emitOpError("result must be [")
           << rows << ", " << dim(getTable(), 1) << "], got "
           << getResult().getType();
  if (getMembers() && *getMembers() < 2)
    return emitOpError("members must be at least 2, got ") << *getMembers();
  return success();
}

LogicalResult PositionAddOp::verify() {
  if (getSeqAttr().getInt() <= 0)
    return emitOpError("seq must be positive");
  int64_t cp = getCp().value_or(1);
  if (cp < 1 || (cp > 1 && int64_t(getSeq()) % (2 * cp) != 0))
    return emitOpError("cp must be positive, and seq a multiple of 2 * cp");
  if (dim(getInput(), 0) % (int64_t(getSeq()) / cp) != 0)
    return emitOpError("rows (")
           << dim(getInput(), 0) << ") must be a multiple of seq (" << getSeq()
           << ")" << (cp > 1 ? " / cp" : "");
  if (dim(getPos(), 0) < getSeqAttr().getInt() ||
      dim(getPos(), 1) != dim(getInput(), 1))
    return emitOpError("position table ")
           << getPos().getType() << " must have at least " << getSeq()
           << " rows of width " << dim(getInput(), 1);
  if (getResult().getType() != getInput().getType())
    return emitOpError("result type must equal the input type");
  return success();
}

LogicalResult LayerNormOp::verify() {
  int64_t h = dim(getInput(), 1);
  if (dim(getGamma(), 0) != h || dim(getBeta(), 0) != h)
    return emitOpError("gamma and beta must have ") << h << " elements";
  if (getResult().getType() != getInput().getType())
    return emitOpError("result type must equal the input type");
  return success();
}

LogicalResult LinearOp::verify() {
  int64_t k = dim(getInput(), 1);
  int64_t wk = getTransposeW() ? dim(getWeight(), 1) : dim(getWeight(), 0);
  int64_t m = getTransposeW() ? dim(getWeight(), 0) : dim(getWeight(), 1);
  if (wk != k)
    return emitOpError("input has ")
           << k << " columns but the weight " << getWeight().getType()
           << " expects " << wk;
  if (getBias() && dim(getBias(), 0) != m)
    return emitOpError("bias must have ") << m << " elements";
  if (dim(getResult(), 0) != dim(getInput(), 0) || dim(getResult(), 1) != m)
    return emitOpError("result must be [")
           << dim(getInput(), 0) << ", " << m << "], got "
           << getResult().getType();
  return success();
}

LogicalResult LinearGradWeightBiasOp::verify() {
  int64_t rows = dim(getInput(), 0), k = dim(getInput(), 1),
          m = dim(getGrad(), 1);
  if (dim(getGrad(), 0) != rows)
    return emitOpError("input and grad must have the same rows, got ")
           << rows << " and " << dim(getGrad(), 0);
  int64_t r0 = getTransposeW() ? m : k, r1 = getTransposeW() ? k : m;
  if (dim(getResult(), 0) != r0 || dim(getResult(), 1) != r1)
    return emitOpError("weight gradient must be [")
           << r0 << ", " << r1 << "], got " << getResult().getType();
  if (dim(getBiasGrad(), 0) != m)
    return emitOpError("bias gradient must have ") << m << " elements";
  return success();
}

LogicalResult BiasAddOp::verify() {
  if (dim(getBias(), 0) != dim(getInput(), 1))
    return emitOpError("bias must have ") << dim(getInput(), 1) << " elements";
  if (getResult().getType() != getInput().getType())
    return emitOpError("result type must equal the input type");
  return success();
}

/// A sequence-parallel row op: `members` >= 2, same columns, and rows
/// multiplied (gathers) or divided (splits, scatters) by `members`.
static LogicalResult verifySpRows(Operation *op, Value input, Value result,
                                  int64_t members, bool gathers) {
  if (members < 2)
    return op->emitOpError("members must be at least 2, got ") << members;
  int64_t in = dim(input, 0), out = dim(result, 0);
  if (dim(input, 1) != dim(result, 1))
    return op->emitOpError("input and result must have the same columns");
  int64_t whole = gathers ? out : in, part = gathers ? in : out;
  if (whole != part * members)
    return op->emitOpError("the whole value must have ")
           << members << " times the rows of each member's part: " << whole
           << " rows against " << part;
  return success();
}

LogicalResult SpAllGatherOp::verify() {
  return verifySpRows(*this, getInput(), getResult(), getMembers(), true);
}
LogicalResult SpGatherOp::verify() {
  return verifySpRows(*this, getInput(), getResult(), getMembers(), true);
}
LogicalResult SpReduceScatterOp::verify() {
  return verifySpRows(*this, getInput(), getResult(), getMembers(), false);
}
LogicalResult SpSplitOp::verify() {
  return verifySpRows(*this, getInput(), getResult(), getMembers(), false);
}

LogicalResult ColumnsOp::verify() {
  int64_t start = getStart(), cols = dim(getInput(), 1),
          taken = dim(getResult(), 1);
  if (dim(getInput(), 0) != dim(getResult(), 0))
    return emitOpError("input and result must have the same rows");
  if (start < 0 || start + taken > cols)
    return emitOpError("columns [")
           << start << ", " << start + taken << ") are not columns of "
           << getInput().getType();
  return success();
}

LogicalResult ColumnsGradOp::verify() {
  int64_t start = getStart(), cols = dim(getResult(), 1),
          given = dim(getInput(), 1);
  if (dim(getInput(), 0) != dim(getResult(), 0))
    return emitOpError("input and result must have the same rows");
  if (start < 0 || start + given > cols)
    return emitOpError("columns [")
           << start << ", " << start + given << ") are not columns of "
           << getResult().getType();
  return success();
}

/// Checks tp_kv_assemble's (and its gradient's) shapes: the member's
/// weight [h, q + 2p] (when given), the gathered pieces [T h, 2p] and the
/// assembled weight [h, q + 2 hd], hd a multiple r of p with r dividing T.
static LogicalResult verifyKvAssemble(Operation *op, Value weight, Value pieces,
                                      Value assembled, int64_t members,
                                      int64_t query) {
  if (members < 2)
    return op->emitOpError("members must be at least 2, got ") << members;
  int64_t rows = dim(assembled, 0), piece2 = dim(pieces, 1);
  if (query < 0 || piece2 <= 0 || piece2 % 2 != 0)
    return op->emitOpError("query must be non-negative and the pieces an "
                           "even, positive number of columns (k then v)");
  if (dim(pieces, 0) != members * rows)
    return op->emitOpError("the gathered pieces must have ")
           << members << " times the weight's " << rows << " rows, got "
           << dim(pieces, 0);
  if (weight && (dim(weight, 0) != rows || dim(weight, 1) != query + piece2))
    return op->emitOpError("the member's weight must be [")
           << rows << ", " << query + piece2 << "] (query + pieces), got "
           << weight.getType();
  int64_t kv2 = dim(assembled, 1) - query;
  int64_t share = piece2 > 0 && kv2 > 0 && kv2 % piece2 == 0 ? kv2 / piece2 : 0;
  if (share <= 0 || members % share != 0)
    return op->emitOpError("the assembled weight's ")
           << kv2 << " key/value columns must be r times the pieces' " << piece2
           << ", r dividing the " << members << " members";
  return success();
}

LogicalResult TpKvAssembleOp::verify() {
  return verifyKvAssemble(*this, getWeight(), getPieces(), getResult(),
                          getMembers(), getQuery());
}

LogicalResult TpKvAssembleGradOp::verify() {
  return verifyKvAssemble(*this, Value(), getResult(), getInput(), getMembers(),
                          getQuery());
}

LogicalResult AttentionOp::verify() {
  int64_t width = dim(getResult(), 1);
  int64_t heads = getHeadsAttr().getInt(), kvHeads = int64_t(getNumKvHeads());
  if (heads <= 0 || getSeqAttr().getInt() <= 0 || kvHeads <= 0)
    return emitOpError("heads, kv_heads and seq must be positive");
  if (width % heads != 0)
    return emitOpError("width ")
           << width << " is not divisible by " << heads << " heads";
  if (heads % kvHeads != 0)
    return emitOpError("heads (")
           << heads << ") must be a multiple of kv_heads (" << kvHeads << ")";
  int64_t hd = width / heads;
  int64_t expected = (heads + 2 * kvHeads) * hd;
  if (dim(getQkv(), 1) != expected)
    return emitOpError("qkv must have (heads + 2 * kv_heads) * head_dim = ")
           << expected << " columns, got " << dim(getQkv(), 1);
  if (getRopeTheta() && (hd % 2 != 0 || getRopeTheta()->convertToDouble() <= 0))
    return emitOpError("rotary embeddings need an even head dimension and a "
                       "positive rope_theta");
  if (getRopeScaling() && !getRopeTheta())
    return emitOpError("rope_scaling needs rope_theta");
  if (dim(getQkv(), 0) != dim(getResult(), 0) ||
      dim(getQkv(), 0) % getSeq() != 0)
    return emitOpError("rows must match and be a multiple of seq");
  if (dim(getLse(), 0) != dim(getResult(), 0) || dim(getLse(), 1) != 2 * heads)
    return emitOpError("lse must be [")
           << dim(getResult(), 0) << ", " << 2 * heads << "] (rows, 2 * heads)";
  return success();
}

LogicalResult AttentionGradOp::verify() {
  int64_t rows = dim(getQkv(), 0), heads = getHeadsAttr().getInt();
  if (getResult().getType() != getQkv().getType())
    return emitOpError("result type must equal the qkv type");
  if (getY().getType() != getGrad().getType() || dim(getY(), 0) != rows)
    return emitOpError("y and grad must have qkv's rows and one type");
  if (heads <= 0 || dim(getLse(), 0) != rows || dim(getLse(), 1) != 2 * heads)
    return emitOpError("lse must be [")
           << rows << ", " << 2 * heads << "] (rows, 2 * heads)";
  return success();
}

LogicalResult RmsNormOp::verify() {
  if (dim(getGamma(), 0) != dim(getInput(), 1))
    return emitOpError("gamma must have ") << dim(getInput(), 1) << " elements";
  if (getResult().getType() != getInput().getType())
    return emitOpError("result type must equal the input type");
  return success();
}

LogicalResult QkNormOp::verify() {
  int64_t heads = getHeads(), kv = getNumKvHeads();
  if (heads < 1 || kv < 1 || heads % kv != 0)
    return emitOpError("heads (")
           << heads << ") must be a positive multiple of kv_heads (" << kv
           << ")";
  int64_t hd = dim(getGamma(), 0) / 2;
  if (dim(getGamma(), 0) % 2 != 0 || hd == 0 ||
      dim(getQkv(), 1) != (heads + 2 * kv) * hd)
    return emitOpError("gamma must be [2 * hd] and qkv [N, (heads + 2 * "
                       "kv_heads) * hd], got ")
           << getGamma().getType() << " and " << getQkv().getType();
  if (getResult().getType() != getQkv().getType())
    return emitOpError("result type must equal the qkv type");
  return success();
}

LogicalResult SwigluOp::verify() {
  if (dim(getInput(), 1) != 2 * dim(getResult(), 1) ||
      dim(getInput(), 0) != dim(getResult(), 0))
    return emitOpError("input must be [N, 2F] for a result [N, F], got ")
           << getInput().getType() << " -> " << getResult().getType();
  return success();
}

LogicalResult MoeRouterOp::verify() {
  int64_t experts = dim(getLogits(), 1), k = getTopKAttr().getInt();
  if (k < 1 || k > experts)
    return emitOpError("top_k must be in [1, ") << experts << "], got " << k;
  for (Value v : {getIndices(), getWeights()})
    if (dim(v, 0) != dim(getLogits(), 0) || dim(v, 1) != k)
      return emitOpError("indices and weights must be [")
             << dim(getLogits(), 0) << ", " << k << "]";
  return success();
}

LogicalResult MoeDispatchOp::verify() {
  if (getExpertsAttr().getInt() < 1 || getCapacityAttr().getInt() < 1)
    return emitOpError("experts and capacity must be positive");
  if (dim(getResult(), 0) !=
          getExpertsAttr().getInt() * getCapacityAttr().getInt() ||
      dim(getResult(), 1) != dim(getInput(), 1))
    return emitOpError("result must be [experts * capacity, width] = [")
           << getExperts() * getCapacity() << ", " << dim(getInput(), 1) << "]";
  if (dim(getIndices(), 0) != dim(getInput(), 0))
    return emitOpError("indices must have one row per token");
  return success();
}

/// Expert-parallel layouts: experts, capacity (and members) positive,
/// members dividing experts, [experts * capacity, H] rows and [experts, 1]
/// counts.
static LogicalResult verifyEpShape(Operation *op, int64_t experts,
                                   int64_t capacity, int64_t members,
                                   Value rows, Value expertCounts) {
  if (experts < 1 || capacity < 1 || members < 1)
    return op->emitOpError("experts, capacity and members must be positive");
  if (experts % members != 0)
    return op->emitOpError("members ")
           << members << " must divide experts " << experts;
  if (rows && dim(rows, 0) != experts * capacity)
    return op->emitOpError("rows must be experts * capacity = ")
           << experts * capacity;
  if (dim(expertCounts, 0) != experts || dim(expertCounts, 1) != 1)
    return op->emitOpError("expert counts must be [") << experts << ", 1]";
  return success();
}

LogicalResult MoeEpCountsOp::verify() {
  if (failed(verifyEpShape(*this, getExperts(), getCapacity(), getMembers(),
                           Value(), getExpertCounts())))
    return failure();
  for (Value v : {getSendCounts(), getExpertSendCounts()})
    if (dim(v, 0) != static_cast<int64_t>(getMembers()))
      return emitOpError("member counts must have one entry per member");
  return success();
}
LogicalResult MoeEpPackOp::verify() {
  return verifyEpShape(*this, getExperts(), getCapacity(), 1, getInput(),
                       getExpertCounts());
}
LogicalResult MoeEpUnpackOp::verify() {
  return verifyEpShape(*this, getExperts(), getCapacity(), 1, getInput(),
                       getExpertCounts());
}
LogicalResult MoeEpGatherOp::verify() {
  return verifyEpShape(*this, getExperts(), getCapacity(), getMembers(),
                       getInput(), getExpertCounts());
}
LogicalResult MoeEpScatterOp::verify() {
  return verifyEpShape(*this, getExperts(), getCapacity(), getMembers(),
                       getInput(), getExpertCounts());
}

LogicalResult MoeCombineOp::verify() {
  if (getExpertsAttr().getInt() < 1 || getCapacityAttr().getInt() < 1)
    return emitOpError("experts and capacity must be positive");
  if (dim(getInput(), 0) !=
      getExpertsAttr().getInt() * getCapacityAttr().getInt())
    return emitOpError("input must have experts * capacity = ")
           << getExperts() * getCapacity() << " rows";
  if (getIndices().getType().getShape() != getWeights().getType().getShape())
    return emitOpError("indices and weights must have the same shape");
  if (dim(getResult(), 0) != dim(getIndices(), 0) ||
      dim(getResult(), 1) != dim(getInput(), 1))
    return emitOpError("result must be [tokens, width]");
  return success();
}

LogicalResult ExpertLinearOp::verify() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  if (getExpertsAttr().getInt() < 1)
    return emitOpError("experts must be positive");
  if (w.getDimSize(0) != getExpertsAttr().getInt())
    return emitOpError("weight must have ") << getExperts() << " experts";
  if (dim(getInput(), 0) % getExperts() != 0)
    return emitOpError("rows must be a multiple of the expert count");
  if (w.getDimSize(1) != dim(getInput(), 1) ||
      dim(getResult(), 1) != w.getDimSize(2) ||
      dim(getResult(), 0) != dim(getInput(), 0))
    return emitOpError("shapes do not chain: ")
           << getInput().getType() << " x " << w << " -> "
           << getResult().getType();
  return success();
}

/// The check every loss op shares: one logits row per target token.
static LogicalResult verifyLossRows(Operation *op, Value logits,
                                    Value targets) {
  int64_t rows = dim(targets, 0) * dim(targets, 1);
  if (dim(logits, 0) != rows)
    return op->emitOpError("logits have ")
           << dim(logits, 0) << " rows but targets hold " << rows << " tokens";
  return success();
}

LogicalResult CrossEntropyOp::verify() {
  return verifyLossRows(*this, getLogits(), getTargets());
}

LogicalResult CrossEntropyFusedOp::verify() {
  if (failed(verifyLossRows(*this, getLogits(), getTargets())))
    return failure();
  if (getDlogits().getType() != getLogits().getType())
    return emitOpError("dlogits must have the logits' type ")
           << getLogits().getType() << ", got " << getDlogits().getType();
  return success();
}

/// The checks shared by the vocabulary-parallel loss ops: `members` at
/// least 2, logits rows equal to the target tokens, and `stats` (when
/// given) [rows, 4 members + 1].
static LogicalResult verifyVocabLoss(Operation *op, Value logits, Value targets,
                                     Value stats, int64_t members) {
  if (members < 2)
    return op->emitOpError("members must be at least 2, got ") << members;
  if (failed(verifyLossRows(op, logits, targets)))
    return failure();
  int64_t rows = dim(logits, 0);
  if (stats && (dim(stats, 0) != rows || dim(stats, 1) != 4 * members + 1))
    return op->emitOpError("statistics must be [")
           << rows << ", " << 4 * members + 1 << "] (4 members + 1 columns), "
           << "got " << stats.getType();
  return success();
}

LogicalResult VocabCeStatsOp::verify() {
  return verifyVocabLoss(*this, getLogits(), getTargets(), getResult(),
                         getMembers());
}

LogicalResult VocabCrossEntropyOp::verify() {
  return verifyVocabLoss(*this, getLogits(), getTargets(), getStats(),
                         getMembers());
}

//===----------------------------------------------------------------------===//
// Program ops
//===----------------------------------------------------------------------===//

void ProgramOp::build(OpBuilder &builder, OperationState &state,
                      StringRef name) {
  state.addAttribute(SymbolTable::getSymbolAttrName(),
                     builder.getStringAttr(name));
  state.addRegion()->push_back(new Block());
}

void DeviceProgramOp::build(OpBuilder &builder, OperationState &state,
                            StringRef name, ArrayRef<int64_t> ranks,
                            int64_t deviceClass) {
  state.addAttribute(SymbolTable::getSymbolAttrName(),
                     builder.getStringAttr(name));
  state.addAttribute("ranks", builder.getDenseI64ArrayAttr(ranks));
  state.addAttribute("device_class", builder.getI64IntegerAttr(deviceClass));
  state.addRegion()->push_back(new Block());
}

/// Only DAG nodes may appear in a program: compute belongs in segments.
/// Ops with a parent constraint of their own report it themselves.
/// Every op of a program body is a program node.
static LogicalResult verifyNodeKinds(Block &body) {
  for (Operation &node : body)
    // A misplaced yield reports its own parent constraint.
    if (!isa<ProgramNodeOpInterface, YieldOp>(node))
      return node.emitOpError("is not a program node");
  return success();
}

/// Each stream name of a program body has one kind (send streams included).
/// Runs after the nodes verified their own attributes.
static LogicalResult verifyStreamKinds(Block &body) {
  llvm::SmallDenseMap<StringRef, std::pair<StreamKind, Operation *>> kinds;
  auto check = [&](Operation *node, StreamAttr stream) -> LogicalResult {
    auto [it, inserted] = kinds.try_emplace(
        stream.getName(), std::make_pair(stream.getKind(), node));
    if (inserted || it->second.first == stream.getKind())
      return success();
    return node->emitOpError("uses stream ")
           << stream.str() << ", but a '" << it->second.second->getName()
           << "' node uses it as a " << stringifyStreamKind(it->second.first)
           << " stream: a stream has one kind";
  };
  for (Operation &node : body) {
    auto n = dyn_cast<ProgramNodeOpInterface>(node);
    if (!n || isa<BatchOp>(node))
      continue;
    if (failed(check(&node, n.getNodeStream())))
      return failure();
    if (auto task = dyn_cast<TaskOp>(node))
      if (StreamAttr send = task.getSendStreamAttr();
          send && failed(check(&node, send)))
        return failure();
  }
  return success();
}

LogicalResult ProgramOp::verify() {
  if (getNumMicrobatchesAttr().getInt() < 1 ||
      getNumReplicasAttr().getInt() < 1)
    return emitOpError("num_microbatches and num_replicas must be positive");
  return verifyNodeKinds(getBody().front());
}

LogicalResult ProgramOp::verifyRegions() {
  return verifyStreamKinds(getBody().front());
}

LogicalResult DeviceProgramOp::verify() {
  if (getDeviceClassAttr().getInt() < 0)
    return emitOpError("device_class must be non-negative");
  if (getNumMicrobatchesAttr().getInt() < 1 ||
      getNumReplicasAttr().getInt() < 1)
    return emitOpError("num_microbatches and num_replicas must be positive");
  if (failed(verifyDeviceGroup(getRanks(), "ranks",
                               [&] { return emitOpError(); })))
    return failure();
  return verifyNodeKinds(getBody().front());
}

LogicalResult DeviceProgramOp::verifyRegions() {
  return verifyStreamKinds(getBody().front());
}

LogicalResult BatchOp::verify() {
  if (getTokens().getType() != getTargets().getType())
    return emitOpError("tokens and targets must have the same type");
  return success();
}

StreamAttr TaskOp::getNodeStream() {
  if (StreamAttr stream = getStreamAttr())
    return stream;
  return StreamAttr::get(getContext(), "compute", StreamKind::compute);
}

LogicalResult TaskOp::verify() {
  if (StreamAttr stream = getStreamAttr(); stream && !stream.isCompute())
    return emitOpError("runs kernels, so its stream must be a compute "
                       "stream, not ")
           << stream.str();
  return success();
}

LogicalResult TaskOp::verifySymbolUses(SymbolTableCollection &tables) {
  auto segment =
      tables.lookupNearestSymbolFrom<SegmentOp>(*this, getSegmentAttr());
  if (!segment)
    return emitOpError("calls unknown segment ") << getSegmentAttr();
  ArrayRef<Type> argTypes = segment.getArgumentTypes();
  if (getArgs().size() != argTypes.size())
    return emitOpError("passes ")
           << getArgs().size() << " arguments but @" << segment.getSymName()
           << " takes " << argTypes.size();
  for (auto [i, pair] :
       llvm::enumerate(llvm::zip(getArgs().getTypes(), argTypes)))
    if (std::get<0>(pair) != std::get<1>(pair))
      return emitOpError("argument #")
             << i << " has type " << std::get<0>(pair) << " but @"
             << segment.getSymName() << " expects " << std::get<1>(pair);
  ArrayRef<Type> resultTypes = segment.getResultTypes();
  if (getOuts().size() != resultTypes.size() ||
      !llvm::equal(getOuts().getTypes(), resultTypes))
    return emitOpError("result types do not match the results of @")
           << segment.getSymName();
  return success();
}

/// The parameters of a ZeRO collective exist and its tensors (gradients
/// summed, or parameters gathered) have their types.
static LogicalResult verifyZeroSymbols(Operation *op, ArrayAttr params,
                                       TypeRange values,
                                       SymbolTableCollection &tables) {
  for (auto [i, a] : llvm::enumerate(params)) {
    FailureOr<ParamOp> param =
        lookupParam(op, cast<FlatSymbolRefAttr>(a), tables);
    if (failed(param))
      return failure();
    if (!values.empty() && values[i] != param->getType())
      return op->emitOpError("tensor ")
             << i << " has type " << values[i] << " but parameter " << a
             << " is " << param->getType();
  }
  return success();
}

LogicalResult
ReduceScatterGradsOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyZeroSymbols(*this, getParams(), getInputs().getTypes(), tables);
}

LogicalResult
AllGatherParamsOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyZeroSymbols(*this, getParams(), getResults().getTypes(), tables);
}

LogicalResult AllReduceOp::verifySymbolUses(SymbolTableCollection &tables) {
  for (Attribute a : getParams())
    if (failed(lookupParam(*this, cast<FlatSymbolRefAttr>(a), tables)))
      return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// Cost
//===----------------------------------------------------------------------===//

static double numElements(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t ? double(t.getNumElements()) : 0;
}

double mlir::piper::countResultElements(Operation *op) {
  double total = 0;
  for (Value r : op->getResults())
    total += numElements(r);
  return total;
}

double mlir::piper::countTensorBytes(Operation *op) {
  double total = 0;
  auto add = [&](Value v) {
    if (auto t = dyn_cast<RankedTensorType>(v.getType()))
      total +=
          double(t.getNumElements()) * double(t.getElementTypeBitWidth()) / 8.0;
  };
  llvm::for_each(op->getOperands(), add);
  llvm::for_each(op->getResults(), add);
  return total;
}

double LinearOp::getFlops() {
  return 2.0 * numElements(getResult()) *
         cast<RankedTensorType>(getInput().getType()).getDimSize(1);
}

// The two halves of a linear's backward are one product each, as large as
// the forward's: 2 FLOPs per result element per contracted element (the
// output features for dx, the rows for dw). So are the experts' layers,
// whose contraction is the same for every expert's rows.
double LinearGradInputOp::getFlops() {
  auto grad = cast<RankedTensorType>(getGrad().getType());
  return 2.0 * numElements(getResult()) * grad.getDimSize(1);
}
double LinearGradWeightOp::getFlops() {
  auto input = cast<RankedTensorType>(getInput().getType());
  return 2.0 * numElements(getResult()) * input.getDimSize(0);
}
double LinearGradWeightBiasOp::getFlops() {
  // The product, and one addition per element of grad for the sums.
  auto input = cast<RankedTensorType>(getInput().getType());
  return 2.0 * numElements(getResult()) * input.getDimSize(0) +
         numElements(getGrad());
}
double ExpertLinearOp::getFlops() {
  return 2.0 * numElements(getResult()) *
         cast<RankedTensorType>(getInput().getType()).getDimSize(1);
}
double ExpertLinearGradInputOp::getFlops() {
  return 2.0 * numElements(getResult()) *
         cast<RankedTensorType>(getGrad().getType()).getDimSize(1);
}
double ExpertLinearGradWeightOp::getFlops() {
  // [E, K, M] from each expert's C rows: 2 C K M per expert.
  auto input = cast<RankedTensorType>(getInput().getType());
  return 2.0 * numElements(getResult()) * input.getDimSize(0) /
         double(getExperts());
}

double AttentionOp::getFlops() {
  return 4.0 * numElements(getResult()) * getSeq();
}

// The backward recomputes the scores (q k^T) and does four more products
// of the forward's size (P v for D, dV, dP, dQ and dK: 2.5 times the
// forward's two).
double AttentionGradOp::getFlops() {
  return 10.0 * numElements(getGrad()) * getSeq();
}

#define GET_OP_CLASSES
#include "dialects/piper/PiperOps.cpp.inc"
