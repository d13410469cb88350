// The parallel layout in the IR: `#piper.mesh<tp = T, cp = C>` (its custom
// assembly and verifier, the layouts it answers) and the module's mesh,
// set by shard_tensor and context_parallel with the streams of their
// collectives (docs/compiler.md, "The parallel layout").
#include "dialects/piper/PiperDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::piper;

static PiperDialect *piperDialect(Operation *op) {
  return op->getContext()->getLoadedDialect<PiperDialect>();
}

LogicalResult MeshAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               int64_t tp, int64_t cp) {
  if (std::string err =
          ParallelLayout::check(Degrees{1, 1, cp, tp, 1}, int64_t(1) << 20);
      !err.empty())
    return emitError() << "mesh: " << err;
  return success();
}

Attribute MeshAttr::parse(AsmParser &parser, Type) {
  SMLoc start = parser.getCurrentLocation();
  std::optional<int64_t> tp, cp;
  if (parser.parseLess())
    return {};
  do {
    SMLoc at = parser.getCurrentLocation();
    StringRef key;
    int64_t value;
    if (parser.parseKeyword(&key) || parser.parseEqual() ||
        parser.parseInteger(value))
      return {};
    std::optional<int64_t> *slot = key == "tp"   ? &tp
                                   : key == "cp" ? &cp
                                                 : nullptr;
    if (!slot || slot->has_value()) {
      parser.emitError(at) << (slot ? "repeated" : "unknown") << " mesh axis '"
                           << key << "' (a mesh has tp and cp)";
      return {};
    }
    *slot = value;
  } while (succeeded(parser.parseOptionalComma()));
  if (parser.parseGreater())
    return {};
  return MeshAttr::getChecked([&] { return parser.emitError(start); },
                              parser.getContext(), tp.value_or(1),
                              cp.value_or(1));
}

void MeshAttr::print(AsmPrinter &printer) const {
  SmallVector<std::string> parts;
  if (getTp() != 1)
    parts.push_back("tp = " + std::to_string(getTp()));
  if (getCp() != 1)
    parts.push_back("cp = " + std::to_string(getCp()));
  if (parts.empty())
    parts = {"tp = 1", "cp = 1"};
  printer << "<" << llvm::join(parts, ", ") << ">";
}

ParallelLayout MeshAttr::replicaLayout(int64_t devices, int64_t ep) const {
  return ParallelLayout(Degrees{1, devices / getTp(), 1, getTp(), ep});
}

ParallelLayout MeshAttr::layout(int64_t devices, int64_t ep) const {
  return ParallelLayout(
      Degrees{1, devices / (getCp() * getTp()), getCp(), getTp(), ep});
}

StringRef mlir::piper::getTensorParallelStream(Operation *module) {
  if (StringAttr s =
          piperDialect(module)->getTensorParallelStreamAttrHelper().getAttr(
              module))
    return s.getValue();
  return "tp_stream";
}

void mlir::piper::setContextParallel(Operation *module, int64_t members,
                                     StringRef stream, bool overlap) {
  Builder b(module->getContext());
  PiperDialect *d = piperDialect(module);
  d->getMeshAttrHelper().setAttr(
      module, MeshAttr::get(b.getContext(), getMesh(module).getTp(), members));
  d->getContextParallelStreamAttrHelper().setAttr(module,
                                                  b.getStringAttr(stream));
  // Absent is the default (overlapped).
  if (!overlap)
    d->getContextParallelOverlapAttrHelper().setAttr(module,
                                                     b.getBoolAttr(false));
}

bool mlir::piper::getContextParallelOverlap(Operation *module) {
  BoolAttr overlap =
      piperDialect(module)->getContextParallelOverlapAttrHelper().getAttr(
          module);
  return !overlap || overlap.getValue();
}

StringRef mlir::piper::getContextParallelStream(Operation *module) {
  if (StringAttr s =
          piperDialect(module)->getContextParallelStreamAttrHelper().getAttr(
              module))
    return s.getValue();
  return "cp_stream";
}

MeshAttr mlir::piper::getMesh(Operation *module) {
  if (MeshAttr mesh = piperDialect(module)->getMeshAttrHelper().getAttr(module))
    return mesh;
  return MeshAttr::get(module->getContext(), 1, 1);
}

void mlir::piper::setTensorParallel(Operation *module, int64_t members,
                                    StringRef stream) {
  Builder b(module->getContext());
  PiperDialect *d = piperDialect(module);
  d->getMeshAttrHelper().setAttr(
      module, MeshAttr::get(b.getContext(), members, getMesh(module).getCp()));
  d->getTensorParallelStreamAttrHelper().setAttr(module,
                                                 b.getStringAttr(stream));
}
