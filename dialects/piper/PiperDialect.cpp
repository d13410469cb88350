// The piper dialect: registration, verifiers and custom assembly.
#include "dialects/piper/PiperDialect.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionImplementation.h"

using namespace mlir;
using namespace mlir::piper;

#include "dialects/piper/PiperDialect.cpp.inc"
#include "dialects/piper/PiperEnums.cpp.inc"
#include "dialects/piper/PiperInterfaces.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "dialects/piper/PiperTypes.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/piper/PiperAttrs.cpp.inc"

void PiperDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "dialects/piper/PiperTypes.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/piper/PiperAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "dialects/piper/PiperOps.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Streams and device groups
//===----------------------------------------------------------------------===//

LogicalResult
StreamAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError,
                   StringRef name, StreamKind) {
  if (name.empty())
    return emitError() << "a stream needs a name";
  return success();
}

std::string StreamAttr::str() const {
  return ("'" + getName() + "' (" + stringifyStreamKind(getKind()) + ")")
      .str();
}

LogicalResult
DeviceGroupAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError,
                        ArrayRef<int64_t> members) {
  return verifyDeviceGroup(members, "a device group", emitError);
}

int64_t DeviceGroupAttr::indexOf(int64_t rank) const {
  ArrayRef<int64_t> m = getMembers();
  auto it = llvm::find(m, rank);
  return it == m.end() ? -1 : static_cast<int64_t>(it - m.begin());
}

Attribute DeviceGroupAttr::parse(AsmParser &parser, Type) {
  SMLoc start = parser.getCurrentLocation();
  SmallVector<int64_t> members;
  if (parser.parseLess())
    return {};
  if (failed(parser.parseOptionalGreater())) {
    do {
      int64_t v;
      if (parser.parseInteger(v))
        return {};
      members.push_back(v);
    } while (succeeded(parser.parseOptionalComma()));
    if (parser.parseGreater())
      return {};
  }
  return DeviceGroupAttr::getChecked([&] { return parser.emitError(start); },
                                     parser.getContext(), members);
}

void DeviceGroupAttr::print(AsmPrinter &printer) const {
  printer << "<";
  llvm::interleaveComma(getMembers(), printer);
  printer << ">";
}

//===----------------------------------------------------------------------===//
// Tags
//===----------------------------------------------------------------------===//

std::optional<int64_t> TagAttr::getIndex(StringRef key) const {
  if (key == "PP")
    return getPp();
  if (key == "EP")
    return getEp();
  if (key == "MB")
    return getMb();
  if (key == "block")
    return getBlock();
  return std::nullopt;
}

TagAttr TagAttr::withMicrobatch(int64_t mb) const {
  return TagAttr::get(getContext(), getPp(), getEp(), mb, getPass(),
                      getBlock());
}

TagAttr TagAttr::withPass(PassKind kind) const {
  return TagAttr::get(getContext(), getPp(), getEp(), getMb(), kind,
                      getBlock());
}

std::string TagAttr::str() const {
  std::string out;
  llvm::raw_string_ostream os(out);
  // Fixed key order reads better than alphabetical.
  for (StringRef key : {"PP", "EP", "MB", "block"})
    if (std::optional<int64_t> v = getIndex(key))
      os << (out.empty() ? "" : " ") << key << "=" << *v;
  if (std::optional<PassKind> pass = getPass())
    os << (out.empty() ? "" : " ") << "PASS=" << stringifyPassKind(*pass);
  return out;
}

LogicalResult
TagAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError,
                std::optional<int64_t> pp, std::optional<int64_t> ep,
                std::optional<int64_t> mb, std::optional<PassKind> pass,
                std::optional<int64_t> block) {
  for (auto [key, v] : {std::pair<StringRef, std::optional<int64_t>>{"PP", pp},
                        {"EP", ep},
                        {"MB", mb},
                        {"block", block}})
    if (v && *v < 0)
      return emitError() << "tag " << key
                         << " must be a non-negative integer, got " << *v;
  return success();
}

Attribute TagAttr::parse(AsmParser &parser, Type) {
  SMLoc start = parser.getCurrentLocation();
  std::optional<int64_t> pp, ep, mb, block;
  std::optional<PassKind> pass;
  if (parser.parseLess())
    return {};
  if (failed(parser.parseOptionalGreater())) {
    llvm::SmallSet<StringRef, 4> seen;
    do {
      SMLoc loc = parser.getCurrentLocation();
      StringRef key;
      if (parser.parseKeyword(&key) || parser.parseEqual())
        return {};
      if (!seen.insert(key).second) {
        parser.emitError(loc, "tag key '") << key << "' given twice";
        return {};
      }
      if (key == "PASS") {
        SMLoc passLoc = parser.getCurrentLocation();
        StringRef name;
        if (parser.parseKeyword(&name))
          return {};
        pass = symbolizePassKind(name);
        if (!pass) {
          parser.emitError(passLoc, "tag PASS must be one of F, B, BI, BW, "
                                    "U, got '")
              << name << "'";
          return {};
        }
        continue;
      }
      std::optional<int64_t> *slot = key == "PP"      ? &pp
                                     : key == "EP"    ? &ep
                                     : key == "MB"    ? &mb
                                     : key == "block" ? &block
                                                      : nullptr;
      if (!slot) {
        parser.emitError(loc, "unknown tag key '")
            << key << "' (expected PP, EP, MB, PASS or block)";
        return {};
      }
      int64_t value;
      if (parser.parseInteger(value))
        return {};
      *slot = value;
    } while (succeeded(parser.parseOptionalComma()));
    if (parser.parseGreater())
      return {};
  }
  return TagAttr::getChecked([&] { return parser.emitError(start); },
                             parser.getContext(), pp, ep, mb, pass, block);
}

void TagAttr::print(AsmPrinter &printer) const {
  SmallVector<std::string> parts;
  for (StringRef key : {"PP", "EP", "MB"})
    if (std::optional<int64_t> v = getIndex(key))
      parts.push_back((key + " = " + Twine(*v)).str());
  if (std::optional<PassKind> pass = getPass())
    parts.push_back(("PASS = " + stringifyPassKind(*pass)).str());
  if (std::optional<int64_t> v = getBlock())
    parts.push_back(("block = " + Twine(*v)).str());
  printer << "<" << llvm::join(parts, ", ") << ">";
}

LogicalResult
PiperDialect::verifyOperationAttribute(Operation *op, NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  if (name == "piper.block") {
    auto block = dyn_cast<IntegerAttr>(attr.getValue());
    if (!block || block.getInt() < 0)
      return op->emitError("'piper.block' must be a non-negative integer, got ")
             << attr.getValue();
    return success();
  }
  if (name == "piper.pass") {
    if (!isa<PassKindAttr>(attr.getValue()))
      return op->emitError("'piper.pass' must be a #piper.pass, got ")
             << attr.getValue();
    return success();
  }
  return op->emitError("unknown piper attribute '") << name << "'";
}

/// Checks the step-level training settings of a program.
static LogicalResult verifyOptimizer(Operation *op, DictionaryAttr settings) {
  for (NamedAttribute entry : settings) {
    StringRef key = entry.getName().getValue();
    Attribute v = entry.getValue();
    bool ok;
    if (key == "min_lr" || key == "clip_grad_norm")
      ok = isa<FloatAttr>(v);
    else if (key == "warmup_steps" || key == "decay_steps")
      ok = isa<IntegerAttr>(v);
    else if (key == "dtype")
      ok = isa<StringAttr>(v) &&
           llvm::is_contained({"f32", "bf16"}, cast<StringAttr>(v).getValue());
    else
      return op->emitOpError("unknown optimizer setting '") << key << "'";
    if (!ok)
      return op->emitOpError("optimizer setting '")
             << key << "' has the wrong type or value: " << v;
  }
  return success();
}

LogicalResult mlir::piper::verifyDeviceGroup(
    ArrayRef<int64_t> devices, StringRef what,
    llvm::function_ref<InFlightDiagnostic()> emitError) {
  if (devices.empty())
    return emitError() << what << " must name at least one device";
  // Groups are verified on every node and may span thousands of devices:
  // the common ascending case is checked in one pass.
  if (devices.front() >= 0 &&
      llvm::adjacent_find(devices, std::greater_equal<int64_t>()) ==
          devices.end())
    return success();
  llvm::SmallDenseSet<int64_t, 8> seen;
  for (int64_t d : devices) {
    if (d < 0)
      return emitError() << what << " has a negative device " << d;
    if (!seen.insert(d).second)
      return emitError() << what << " names device " << d << " twice";
  }
  return success();
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
  return success();
}

void SegmentOp::build(OpBuilder &builder, OperationState &state,
                      StringRef name, FunctionType type) {
  state.addAttribute(SymbolTable::getSymbolAttrName(),
                     builder.getStringAttr(name));
  state.addAttribute(getFunctionTypeAttrName(state.name),
                     TypeAttr::get(type));
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
    return emitOpError("yields ") << getValues().size()
                                  << " values but segment @"
                                  << segment.getSymName() << " returns "
                                  << expected.size();
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
    return emitOpError("type ") << getResult().getType()
                                << " does not match parameter "
                                << getParamAttr() << " of type "
                                << param->getType();
  return success();
}

LogicalResult AccumulateGradOp::verifySymbolUses(SymbolTableCollection &tables) {
  FailureOr<ParamOp> param = lookupParam(*this, getParamAttr(), tables);
  if (failed(param))
    return failure();
  if (param->getType() != getGrad().getType())
    return emitOpError("gradient type ") << getGrad().getType()
                                         << " does not match parameter "
                                         << getParamAttr() << " of type "
                                         << param->getType();
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
    return emitOpError("result must be [") << rows << ", " << dim(getTable(), 1)
                                           << "], got " << getResult().getType();
  return success();
}

LogicalResult PositionAddOp::verify() {
  if (getSeqAttr().getInt() <= 0)
    return emitOpError("seq must be positive");
  if (dim(getInput(), 0) % getSeq() != 0)
    return emitOpError("rows (") << dim(getInput(), 0)
                                 << ") must be a multiple of seq (" << getSeq()
                                 << ")";
  if (dim(getPos(), 0) < getSeqAttr().getInt() || dim(getPos(), 1) != dim(getInput(), 1))
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
    return emitOpError("input has ") << k << " columns but the weight "
                                     << getWeight().getType() << " expects "
                                     << wk;
  if (getBias() && dim(getBias(), 0) != m)
    return emitOpError("bias must have ") << m << " elements";
  if (dim(getResult(), 0) != dim(getInput(), 0) || dim(getResult(), 1) != m)
    return emitOpError("result must be [") << dim(getInput(), 0) << ", " << m
                                           << "], got " << getResult().getType();
  return success();
}

LogicalResult AttentionOp::verify() {
  int64_t width = dim(getResult(), 1);
  int64_t heads = getHeadsAttr().getInt(), kvHeads = int64_t(getNumKvHeads());
  if (heads <= 0 || getSeqAttr().getInt() <= 0 || kvHeads <= 0)
    return emitOpError("heads, kv_heads and seq must be positive");
  if (width % heads != 0)
    return emitOpError("width ") << width << " is not divisible by " << heads
                                 << " heads";
  if (heads % kvHeads != 0)
    return emitOpError("heads (") << heads
                                  << ") must be a multiple of kv_heads ("
                                  << kvHeads << ")";
  int64_t hd = width / heads;
  int64_t expected = (heads + 2 * kvHeads) * hd;
  if (dim(getQkv(), 1) != expected)
    return emitOpError("qkv must have (heads + 2 * kv_heads) * head_dim = ")
           << expected << " columns, got " << dim(getQkv(), 1);
  if (getRopeTheta() && (hd % 2 != 0 || getRopeTheta()->convertToDouble() <= 0))
    return emitOpError("rotary embeddings need an even head dimension and a "
                       "positive rope_theta");
  if (dim(getQkv(), 0) != dim(getResult(), 0) ||
      dim(getQkv(), 0) % getSeq() != 0)
    return emitOpError("rows must match and be a multiple of seq");
  return success();
}

LogicalResult RmsNormOp::verify() {
  if (dim(getGamma(), 0) != dim(getInput(), 1))
    return emitOpError("gamma must have ") << dim(getInput(), 1)
                                           << " elements";
  if (getResult().getType() != getInput().getType())
    return emitOpError("result type must equal the input type");
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
  if (dim(getResult(), 0) != getExpertsAttr().getInt() * getCapacityAttr().getInt() ||
      dim(getResult(), 1) != dim(getInput(), 1))
    return emitOpError("result must be [experts * capacity, width] = [")
           << getExperts() * getCapacity() << ", " << dim(getInput(), 1)
           << "]";
  if (dim(getIndices(), 0) != dim(getInput(), 0))
    return emitOpError("indices must have one row per token");
  return success();
}

LogicalResult MoeCombineOp::verify() {
  if (getExpertsAttr().getInt() < 1 || getCapacityAttr().getInt() < 1)
    return emitOpError("experts and capacity must be positive");
  if (dim(getInput(), 0) != getExpertsAttr().getInt() * getCapacityAttr().getInt())
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

LogicalResult CrossEntropyOp::verify() {
  int64_t rows = dim(getTargets(), 0) * dim(getTargets(), 1);
  if (dim(getLogits(), 0) != rows)
    return emitOpError("logits have ") << dim(getLogits(), 0)
                                       << " rows but targets hold " << rows
                                       << " tokens";
  return success();
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
        << "' node uses it as a "
        << stringifyStreamKind(it->second.first)
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
  if (auto settings = getOptimizerAttr();
      settings && failed(verifyOptimizer(*this, settings)))
    return failure();
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
  if (auto settings = getOptimizerAttr();
      settings && failed(verifyOptimizer(*this, settings)))
    return failure();
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
    return emitOpError("passes ") << getArgs().size() << " arguments but @"
                                  << segment.getSymName() << " takes "
                                  << argTypes.size();
  for (auto [i, pair] :
       llvm::enumerate(llvm::zip(getArgs().getTypes(), argTypes)))
    if (std::get<0>(pair) != std::get<1>(pair))
      return emitOpError("argument #") << i << " has type " << std::get<0>(pair)
                                       << " but @" << segment.getSymName()
                                       << " expects " << std::get<1>(pair);
  ArrayRef<Type> resultTypes = segment.getResultTypes();
  if (getOuts().size() != resultTypes.size() ||
      !llvm::equal(getOuts().getTypes(), resultTypes))
    return emitOpError("result types do not match the results of @")
           << segment.getSymName();
  return success();
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
      total += double(t.getNumElements()) *
               double(t.getElementTypeBitWidth()) / 8.0;
  };
  llvm::for_each(op->getOperands(), add);
  llvm::for_each(op->getResults(), add);
  return total;
}

double LinearOp::getFlops() {
  return 2.0 * numElements(getResult()) *
         cast<RankedTensorType>(getInput().getType()).getDimSize(1);
}

double AttentionOp::getFlops() {
  return 4.0 * numElements(getResult()) * getSeq();
}

#define GET_OP_CLASSES
#include "dialects/piper/PiperOps.cpp.inc"
