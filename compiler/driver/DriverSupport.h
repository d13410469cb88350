// Shared pieces of the piperc and piper-opt drivers: input checks that turn
// bad files into errors, and writing IR and plans.
#ifndef PIPER_COMPILER_DRIVER_DRIVERSUPPORT_H
#define PIPER_COMPILER_DRIVER_DRIVERSUPPORT_H

#include <string>

#include "compiler/lowering/LowerToPlan.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/SourceMgr.h"

namespace mlir::piper::driver {

/// Prints "piperc: error: MSG" and returns the exit code 1.
int fail(const std::string &msg);

/// Refuses a path that is not a regular file (a FIFO, /dev/zero, a folder)
/// before reading it; "" when it may be read. "-" and missing files are
/// left to the reader.
std::string checkRegularFile(llvm::StringRef path, llvm::StringRef what);

/// Refuses MLIR nested deeper than the parser's stack allows; "" when fine.
std::string checkMlirNesting(llvm::StringRef text, llvm::StringRef what,
                             llvm::StringRef path);

/// Refuses tensors too large to plan (dimensions, bytes, model total).
LogicalResult checkTensorSizes(ModuleOp module);

/// Reads, parses and verifies the MLIR file `path` (a `what`: "model" or
/// "program") with diagnostics through `sourceMgr`, refusing non-regular
/// files' nesting and tensors too large to `verb` ("compile", "lower");
/// null with `error` set on failure.
OwningOpRef<ModuleOp> loadModule(MLIRContext &ctx, llvm::SourceMgr &sourceMgr,
                                 const std::string &path, llvm::StringRef what,
                                 llvm::StringRef verb, std::string &error);

/// A number flag's error when it is NaN or infinite; "" when finite.
std::string finite(const char *flag, double value);

/// Prints `module` to `path` (standard output when empty); the exit code.
int writeOutput(ModuleOp module, const std::string &path);

/// Writes one plan file per class and the manifest into folder `dir`
/// (created if missing); "" on success, else the error.
std::string writePlans(const LoweredPlans &lowered, const std::string &dir);

/// `piperc lower`: plans from a hand-written, placed training program.
struct LowerOptions {
  std::string input, output;
};
int runLower(const LowerOptions &options);

} // namespace mlir::piper::driver

#endif // PIPER_COMPILER_DRIVER_DRIVERSUPPORT_H
