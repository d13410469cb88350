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

#include "dialects/piper/PiperDialect.h.inc"
#include "dialects/piper/PiperEnums.h.inc"

#define GET_TYPEDEF_CLASSES
#include "dialects/piper/PiperTypes.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/piper/PiperAttrs.h.inc"

#define GET_OP_CLASSES
#include "dialects/piper/PiperOps.h.inc"

namespace mlir::piper {

/// Tag keys a node may carry, and the passes a PASS tag may name.
inline constexpr llvm::StringLiteral kTagKeys[] = {"PP", "EP", "MB", "PASS",
                                                   "block"};
inline constexpr llvm::StringLiteral kPasses[] = {"F", "B", "BI", "BW", "U"};

/// Checks a tag dictionary: known keys, non-negative integer indices, a PASS
/// from kPasses. Reports through `emitError` and fails on the first problem.
LogicalResult verifyTag(DictionaryAttr tag,
                        llvm::function_ref<InFlightDiagnostic()> emitError);

/// Checks a device group: non-empty, non-negative, no repeats.
LogicalResult verifyDeviceGroup(llvm::ArrayRef<int64_t> devices,
                                llvm::StringRef what,
                                llvm::function_ref<InFlightDiagnostic()> emitError);

/// Returns integer tag `key` of `tag`, if present.
std::optional<int64_t> getTagInt(DictionaryAttr tag, llvm::StringRef key);
/// Returns the PASS of `tag`, or "" when absent.
llvm::StringRef getTagPass(DictionaryAttr tag);
/// Formats a tag for diagnostics and labels: "PP=1 MB=3 PASS=F".
std::string formatTag(DictionaryAttr tag);

} // namespace mlir::piper

#endif // PIPER_DIALECTS_PIPER_PIPERDIALECT_H
