// The attributes of the piper dialect: streams, device groups and tags
// (verifiers and custom assembly), and the discardable attributes the
// dialect verifies on segments.
#include "dialects/piper/PiperDialect.h"

#include <cmath>

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/InterleavedRange.h"

using namespace mlir;
using namespace mlir::piper;

#define GET_ATTRDEF_CLASSES
#include "dialects/piper/PiperAttrs.cpp.inc"

void PiperDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/piper/PiperAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Streams and device groups
//===----------------------------------------------------------------------===//

LogicalResult
TensorSliceAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError,
                        int64_t dim, int64_t members, ArrayRef<int64_t> parts) {
  if (dim < 0)
    return emitError() << "tensor_slice dim must be non-negative, got " << dim;
  if (members < 2)
    return emitError() << "tensor_slice members must be at least 2, got "
                       << members;
  for (int64_t part : parts)
    if (part <= 0 || part % members != 0)
      return emitError() << "tensor_slice part " << part
                         << " is not a positive multiple of the " << members
                         << " members";
  return success();
}

LogicalResult
HfSourceAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError,
                     StringRef name, ArrayRef<int64_t> shape,
                     BoolAttr transpose, int64_t index, int64_t offset) {
  if (name.empty())
    return emitError() << "hf_source needs a tensor name";
  if (shape.empty() || shape.size() > 2 ||
      llvm::any_of(shape, [](int64_t d) { return d <= 0; }))
    return emitError() << "hf_source '" << name
                       << "' must have a 1-D or 2-D positive shape";
  if (!transpose || (transpose.getValue() && shape.size() != 2))
    return emitError() << "hf_source '" << name
                       << "': only a 2-D tensor can be transposed";
  if (index < 0 || offset < 0)
    return emitError() << "hf_source '" << name
                       << "': index and offset must be non-negative";
  return success();
}

LogicalResult
RopeScalingAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError,
                        APFloat factor, APFloat low, APFloat high,
                        int64_t originalMaxPosition) {
  double f = factor.convertToDouble(), l = low.convertToDouble(),
         h = high.convertToDouble();
  if (!(f > 0) || !std::isfinite(f))
    return emitError() << "rope_llama3 factor must be positive, got " << f;
  if (!(l > 0) || !(h > l) || !std::isfinite(h))
    return emitError() << "rope_llama3 needs 0 < low_freq_factor < "
                          "high_freq_factor, got "
                       << l << " and " << h;
  if (originalMaxPosition <= 0)
    return emitError() << "rope_llama3 original_max_position must be "
                          "positive, got "
                       << originalMaxPosition;
  return success();
}

Attribute RopeScalingAttr::parse(AsmParser &parser, Type) {
  SMLoc start = parser.getCurrentLocation();
  double factor, low, high;
  int64_t original;
  if (parser.parseLess() || parser.parseKeyword("factor") ||
      parser.parseEqual() || parser.parseFloat(factor) || parser.parseComma() ||
      parser.parseKeyword("low_freq_factor") || parser.parseEqual() ||
      parser.parseFloat(low) || parser.parseComma() ||
      parser.parseKeyword("high_freq_factor") || parser.parseEqual() ||
      parser.parseFloat(high) || parser.parseComma() ||
      parser.parseKeyword("original_max_position") || parser.parseEqual() ||
      parser.parseInteger(original) || parser.parseGreater())
    return {};
  return RopeScalingAttr::getChecked([&] { return parser.emitError(start); },
                                     parser.getContext(), APFloat(factor),
                                     APFloat(low), APFloat(high), original);
}

void RopeScalingAttr::print(AsmPrinter &printer) const {
  printer << "<factor = ";
  printer.printFloat(getFactor());
  printer << ", low_freq_factor = ";
  printer.printFloat(getLowFreqFactor());
  printer << ", high_freq_factor = ";
  printer.printFloat(getHighFreqFactor());
  printer << ", original_max_position = " << getOriginalMaxPosition() << ">";
}

LogicalResult
StreamAttr::verify(llvm::function_ref<InFlightDiagnostic()> emitError,
                   StringRef name, StreamKind) {
  if (name.empty())
    return emitError() << "a stream needs a name";
  return success();
}

std::string StreamAttr::str() const {
  return ("'" + getName() + "' (" + stringifyStreamKind(getKind()) + ")").str();
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

static PiperDialect *piperDialect(Operation *op) {
  return op->getContext()->getLoadedDialect<PiperDialect>();
}

void mlir::piper::setSegmentPass(Operation *segment, PassKind pass) {
  piperDialect(segment)->getPassAttrHelper().setAttr(
      segment, PassKindAttr::get(segment->getContext(), pass));
}

void mlir::piper::setModelBlock(Operation *segment, int64_t block) {
  Builder b(segment->getContext());
  piperDialect(segment)->getBlockAttrHelper().setAttr(
      segment, b.getI64IntegerAttr(block));
}

std::optional<int64_t> mlir::piper::getModelBlock(Operation *segment) {
  if (IntegerAttr block =
          piperDialect(segment)->getBlockAttrHelper().getAttr(segment))
    return block.getInt();
  return std::nullopt;
}

void mlir::piper::setRecomputeRegion(Operation *op, int64_t region) {
  Builder b(op->getContext());
  piperDialect(op)->getRecomputeAttrHelper().setAttr(
      op, b.getI64IntegerAttr(region));
}

std::optional<int64_t> mlir::piper::getRecomputeRegion(Operation *op) {
  if (IntegerAttr region =
          piperDialect(op)->getRecomputeAttrHelper().getAttr(op))
    return region.getInt();
  return std::nullopt;
}

void mlir::piper::clearRecomputeRegion(Operation *op) {
  op->removeAttr(piperDialect(op)->getRecomputeAttrHelper().getName());
}

void mlir::piper::setSequencePartial(Operation *param) {
  piperDialect(param)->getSequencePartialAttrHelper().setAttr(
      param, UnitAttr::get(param->getContext()));
}

bool mlir::piper::isSequencePartial(Operation *param) {
  return static_cast<bool>(
      piperDialect(param)->getSequencePartialAttrHelper().getAttr(param));
}

void mlir::piper::setHfSources(Operation *param,
                               ArrayRef<HfSourceAttr> sources) {
  SmallVector<Attribute> attrs(sources.begin(), sources.end());
  piperDialect(param)->getHfSourcesAttrHelper().setAttr(
      param, ArrayAttr::get(param->getContext(), attrs));
}

SmallVector<HfSourceAttr> mlir::piper::getHfSources(Operation *param) {
  SmallVector<HfSourceAttr> out;
  if (ArrayAttr a =
          piperDialect(param)->getHfSourcesAttrHelper().getAttr(param))
    for (Attribute s : a)
      if (auto source = dyn_cast<HfSourceAttr>(s))
        out.push_back(source);
  return out;
}

void mlir::piper::setHfConfig(Operation *module, StringRef json) {
  piperDialect(module)->getHfConfigAttrHelper().setAttr(
      module, StringAttr::get(module->getContext(), json));
}

StringRef mlir::piper::getHfConfig(Operation *module) {
  if (StringAttr s =
          piperDialect(module)->getHfConfigAttrHelper().getAttr(module))
    return s.getValue();
  return "";
}

namespace {

/// Checks that `sources` cover parameter `param`'s global tensor exactly:
/// each placed inside it, their elements adding up to its own.
LogicalResult verifyHfSources(ParamOp param, ArrayAttr sources) {
  SmallVector<int64_t> global(param.getTensorType().getShape());
  if (std::optional<uint64_t> m = param.getExpertMembers())
    global[0] *= static_cast<int64_t>(*m);
  if (TensorSliceAttr slice = param.getTensorSliceAttr())
    global[slice.getDim()] *= slice.getMembers();
  int64_t covered = 0;
  for (Attribute a : sources) {
    auto s = dyn_cast<HfSourceAttr>(a);
    if (!s)
      return param.emitError("'piper.hf_sources' must hold #piper.hf_source "
                             "attributes, got ")
             << a;
    SmallVector<int64_t> placed(s.getShape());
    if (s.getTranspose().getValue())
      std::swap(placed[0], placed[1]);
    const size_t lead = global.size() - placed.size();
    bool fits = (lead == 0 && s.getIndex() == 0) ||
                (lead == 1 && s.getIndex() < global[0]);
    for (size_t d = 0; fits && d < placed.size(); ++d) {
      int64_t start = d + 1 == placed.size() ? s.getOffset() : 0;
      fits = start + placed[d] <= global[lead + d] &&
             (d + 1 == placed.size() || placed[d] == global[lead + d]);
    }
    if (!fits)
      return param.emitError("Hugging Face tensor '")
             << s.getName() << "' does not fit parameter @"
             << param.getSymName() << " of global shape "
             << llvm::interleaved_array(global);
    covered += llvm::product_of(placed);
  }
  if (covered != llvm::product_of(global))
    return param.emitError("the Hugging Face tensors of parameter @")
           << param.getSymName() << " cover " << covered << " of its "
           << llvm::product_of(global) << " elements";
  return success();
}

} // namespace

LogicalResult
OptimizerAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                      APFloat minLr, int64_t warmupSteps, int64_t decaySteps,
                      APFloat clipGradNorm, ComputeType) {
  double lr = minLr.convertToDouble(), clip = clipGradNorm.convertToDouble();
  if (!(lr >= 0) || !(clip >= 0) || warmupSteps < 0 || decaySteps < 0)
    return emitError() << "optimizer settings must be non-negative, got "
                          "min_lr = "
                       << lr << ", warmup_steps = " << warmupSteps
                       << ", decay_steps = " << decaySteps
                       << ", clip_grad_norm = " << clip;
  return success();
}

LogicalResult PiperDialect::verifyOperationAttribute(Operation *op,
                                                     NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  if (name == BlockAttrHelper::getNameStr()) {
    auto block = dyn_cast<IntegerAttr>(attr.getValue());
    if (!block || block.getInt() < 0)
      return op->emitError("'piper.block' must be a non-negative integer, got ")
             << attr.getValue();
    return success();
  }
  if (name == RecomputeAttrHelper::getNameStr()) {
    auto region = dyn_cast<IntegerAttr>(attr.getValue());
    if (!region || region.getInt() < 0)
      return op->emitError(
                 "'piper.recompute' must be a non-negative integer, got ")
             << attr.getValue();
    return success();
  }
  if (name == MeshAttrHelper::getNameStr()) {
    auto mesh = dyn_cast<MeshAttr>(attr.getValue());
    if (!isa<ModuleOp>(op) || !mesh || mesh.getTp() * mesh.getCp() < 2)
      return op->emitError("'piper.mesh' must be a #piper.mesh of tp or cp "
                           "at least 2 on the module, got ")
             << attr.getValue();
    return success();
  }
  if (name == TensorParallelStreamAttrHelper::getNameStr()) {
    auto s = dyn_cast<StringAttr>(attr.getValue());
    if (!isa<ModuleOp>(op) || !s || s.getValue().empty())
      return op->emitError("'piper.tensor_parallel_stream' must be a stream "
                           "name on the module, got ")
             << attr.getValue();
    return success();
  }
  if (name == ContextParallelStreamAttrHelper::getNameStr()) {
    auto s = dyn_cast<StringAttr>(attr.getValue());
    if (!isa<ModuleOp>(op) || !s || s.getValue().empty())
      return op->emitError("'piper.context_parallel_stream' must be a stream "
                           "name on the module, got ")
             << attr.getValue();
    return success();
  }
  if (name == ContextParallelOverlapAttrHelper::getNameStr()) {
    if (!isa<ModuleOp>(op) || !isa<BoolAttr>(attr.getValue()))
      return op->emitError("'piper.context_parallel_overlap' must be a "
                           "boolean on the module, got ")
             << attr.getValue();
    return success();
  }
  if (name == SequencePartialAttrHelper::getNameStr()) {
    if (!isa<ParamOp>(op) || !isa<UnitAttr>(attr.getValue()))
      return op->emitError("'piper.sequence_partial' must be a unit "
                           "attribute on a piper.param");
    return success();
  }
  if (name == HfSourcesAttrHelper::getNameStr()) {
    auto param = dyn_cast<ParamOp>(op);
    auto sources = dyn_cast<ArrayAttr>(attr.getValue());
    if (!param || !sources)
      return op->emitError("'piper.hf_sources' must be an array of "
                           "#piper.hf_source on a piper.param");
    return verifyHfSources(param, sources);
  }
  if (name == HfConfigAttrHelper::getNameStr()) {
    if (!isa<ModuleOp>(op) || !isa<StringAttr>(attr.getValue()))
      return op->emitError("'piper.hf_config' must be a string on the "
                           "module, got ")
             << attr.getValue();
    return success();
  }
  if (name == PassAttrHelper::getNameStr()) {
    if (!isa<PassKindAttr>(attr.getValue()))
      return op->emitError("'piper.pass' must be a #piper.pass, got ")
             << attr.getValue();
    return success();
  }
  return op->emitError("unknown piper attribute '") << name << "'";
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
