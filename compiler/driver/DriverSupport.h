// Shared pieces of the piperc and piper-opt drivers: input checks that turn
// bad files into errors, and writing IR and plans.
#ifndef PIPER_COMPILER_DRIVER_DRIVERSUPPORT_H
#define PIPER_COMPILER_DRIVER_DRIVERSUPPORT_H

#include <functional>
#include <string>

#include "compiler/lowering/LowerToPlan.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

namespace CLI {
class App;
} // namespace CLI

namespace mlir::piper::driver {

/// A piperc subcommand: its parser, and what runs it once parsed.
struct Subcommand {
  CLI::App *cmd = nullptr;
  std::function<int()> run;
};

/// `piperc model` (ModelCommand.cpp): adds the subcommand and its options
/// to `app`.
Subcommand addModelCommand(CLI::App &app);

/// `piperc search` (SearchCommand.cpp): adds the subcommand and its options
/// to `app`.
Subcommand addSearchCommand(CLI::App &app);

/// Prints "piperc: error: MSG" and returns the exit code 1.
int fail(const std::string &msg);

/// Refuses a path that is not a regular file (a FIFO, /dev/zero, a folder)
/// or "-" before reading it, with the shared reader's check; "" when it may
/// be read.
std::string checkRegularFile(llvm::StringRef path, llvm::StringRef what);

/// Refuses MLIR text the parser would crash or stall on (scanMlirText:
/// nesting, long numbers); "" when fine, else the error naming the input.
std::string checkMlirText(llvm::StringRef text, llvm::StringRef what,
                          llvm::StringRef path);

/// Reads the MLIR input `path` ("-": standard input), a `what`, with the
/// shared reader (size cap, no FIFOs or devices) and checks it with
/// checkMlirText; null with `error` set when refused.
std::unique_ptr<llvm::MemoryBuffer>
readMlirInput(llvm::StringRef path, llvm::StringRef what, std::string &error);

/// Flushes (and, for a file, closes) `os`, which writes `path` ("" or "-":
/// standard output); "" when every byte was written, else the error, with
/// the stream's error cleared so that its destructor does not abort.
std::string closeOutput(llvm::raw_fd_ostream &os, llvm::StringRef path);

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
