// Input checks and output writers shared by the piperc sub-commands.
#include "compiler/driver/DriverSupport.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>

#include "compiler/driver/MlirScan.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/FileUtilities.h"
#include "proto/InputFile.h"
#include "proto/PlanFile.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/ToolOutputFile.h"

namespace mlir::piper::driver {

int fail(const std::string &msg) {
  llvm::errs() << "piperc: error: " << msg << "\n";
  return 1;
}

std::string checkRegularFile(llvm::StringRef path, llvm::StringRef what) {
  std::string err = ::piper::checkInputPath(path.str());
  return err.empty() ? "" : ::piper::inputError(what.str(), path.str(), err);
}

std::string checkMlirText(llvm::StringRef text, llvm::StringRef what,
                          llvm::StringRef path) {
  std::string err = scanMlirText(text);
  return err.empty() ? "" : ::piper::inputError(what.str(), path.str(), err);
}

std::unique_ptr<llvm::MemoryBuffer>
readMlirInput(llvm::StringRef path, llvm::StringRef what, std::string &error) {
  std::string text;
  if (std::string err = ::piper::readInputFile(path.str(), text);
      !err.empty()) {
    error = ::piper::inputError(what.str(), path.str(), err);
    return nullptr;
  }
  if (std::string err = checkMlirText(text, what, path); !err.empty()) {
    error = err;
    return nullptr;
  }
  // MLIR's own name for standard input, which diagnostics show.
  return llvm::MemoryBuffer::getMemBufferCopy(text,
                                              path == "-" ? "<stdin>" : path);
}

std::string closeOutput(llvm::raw_fd_ostream &os, llvm::StringRef path) {
  os.flush();
  if (!os.has_error() && path != "-" && !path.empty())
    os.close();
  if (!os.has_error())
    return "";
  std::string message = os.error().message();
  if (!message.empty())
    message[0] = static_cast<char>(std::tolower(message[0]));
  // An error left set makes the stream's destructor abort the process.
  os.clear_error();
  if (path.empty() || path == "-")
    return "cannot write to standard output: " + message;
  return ("cannot write '" + path + "': " + message).str();
}

/// Limits on the tensors of a model: each dimension fits the int32 fields
/// of plan.proto, and byte counts stay far from int64 overflow.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxTensorBytes = int64_t(1) << 48;   // 256 TiB
constexpr int64_t kMaxModelBytes = int64_t(1) << 56;    // every tensor type

/// Checks every tensor type the model mentions (results, block arguments,
/// attributes such as a parameter's type) against kMaxDim and
/// kMaxTensorBytes, with overflow-checked products; reports the first
/// offender at its location.
LogicalResult checkTensorSizes(ModuleOp module) {
  int64_t total = 0;
  Operation *where = nullptr;
  std::string error;
  auto check = [&](Type type) {
    auto shaped = dyn_cast<ShapedType>(type);
    if (!error.empty() || !shaped || !shaped.hasRank())
      return;
    Type elem = shaped.getElementType();
    int64_t bytes = elem.isIntOrFloat()
                        ? std::max<int64_t>(1, (elem.getIntOrFloatBitWidth() + 7) / 8)
                        : 8;
    for (int64_t dim : shaped.getShape()) {
      if (dim > kMaxDim) {
        error = llvm::formatv("tensor dimension {0} is more than the limit of "
                              "{1}",
                              dim, kMaxDim)
                    .str();
        return;
      }
      if (dim >= 0 && llvm::MulOverflow(bytes, dim, bytes)) {
        bytes = std::numeric_limits<int64_t>::max();
        break;
      }
      if (bytes > kMaxTensorBytes)
        break;
    }
    if (bytes > kMaxTensorBytes) {
      error = llvm::formatv("a tensor of shape {0} is more than the limit of "
                            "{1} bytes",
                            llvm::join(llvm::map_range(shaped.getShape(),
                                                       [](int64_t d) {
                                                         return std::to_string(d);
                                                       }),
                                       "x"),
                            kMaxTensorBytes)
                  .str();
      return;
    }
    total += bytes;
    if (total > kMaxModelBytes)
      error = llvm::formatv("the model's tensors hold more than the limit of "
                            "{0} bytes",
                            kMaxModelBytes)
                  .str();
  };
  module->walk([&](Operation *op) {
    if (!error.empty())
      return WalkResult::interrupt();
    for (Type t : op->getResultTypes())
      check(t);
    for (Region &region : op->getRegions())
      for (Block &block : region)
        for (BlockArgument arg : block.getArguments())
          check(arg.getType());
    op->getAttrDictionary().walk([&](Type t) { check(t); });
    if (!error.empty())
      where = op;
    return error.empty() ? WalkResult::advance() : WalkResult::interrupt();
  });
  if (error.empty())
    return success();
  where->emitError(error);
  return failure();
}

/// A number flag's error when it is NaN or infinite.
std::string finite(const char *flag, double value) {
  if (std::isfinite(value))
    return "";
  return llvm::formatv("{0} must be a finite number, got {1}", flag,
                       llvm::format("%g", value))
      .str();
}

int writeOutput(ModuleOp module, const std::string &path) {
  std::string error;
  auto out = openOutputFile(path.empty() ? "-" : path, &error);
  if (!out)
    return fail(error);
  module.print(out->os());
  out->os() << "\n";
  if (std::string err = closeOutput(out->os(), path); !err.empty())
    return fail(err);
  out->keep();
  return 0;
}

OwningOpRef<ModuleOp> loadModule(MLIRContext &ctx, llvm::SourceMgr &sourceMgr,
                                 const std::string &path, llvm::StringRef what,
                                 llvm::StringRef verb, std::string &error) {
  std::unique_ptr<llvm::MemoryBuffer> file = readMlirInput(path, what, error);
  if (!file)
    return nullptr;
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &ctx);
  if (!module) {
    error = ("cannot parse " + what + " '" + path + "'").str();
    return nullptr;
  }
  if (failed(verify(*module))) {
    error = ("the " + what + " does not verify").str();
    return nullptr;
  }
  if (failed(checkTensorSizes(*module))) {
    error = (what + " '" + path + "' has a tensor too large to " + verb).str();
    return nullptr;
  }
  return module;
}

std::string writePlans(const LoweredPlans &lowered, const std::string &dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return "cannot create '" + dir + "': " + ec.message();
  for (const auto &[c, plan] : llvm::enumerate(lowered.plans)) {
    std::string path = dir + "/" + lowered.manifest.classes(c).plan_file();
    if (std::string err = ::piper::plan::writePlanFile(path, plan);
        !err.empty())
      return err;
  }
  return ::piper::plan::writeManifest(dir + "/manifest.textproto",
                                      lowered.manifest);
}

} // namespace mlir::piper::driver
