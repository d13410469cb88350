// Input checks and output writers shared by the piperc sub-commands.
#include "compiler/driver/DriverSupport.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/ToolOutputFile.h"
#include "proto/PlanFile.h"

namespace mlir::piper::driver {

int fail(const std::string &msg) {
  llvm::errs() << "piperc: error: " << msg << "\n";
  return 1;
}

/// How deep the brackets of a model may nest ({ ( [ < together). MLIR's
/// parser recurses once per level, so a few thousand levels overflow the
/// stack; real models nest fewer than 20.
static constexpr int64_t kMaxMlirNesting = 256;

/// Refuses a path that is not a regular file (a FIFO, /dev/zero, a
/// folder) before reading it: reading one would block or never end. "-"
/// (standard input) and missing files are left to the reader.
std::string checkRegularFile(llvm::StringRef path, llvm::StringRef what) {
  if (path == "-")
    return "";
  llvm::sys::fs::file_status status;
  if (llvm::sys::fs::status(path, status))
    return "";
  if (status.type() == llvm::sys::fs::file_type::directory_file)
    return (what + " '" + path + "' is a directory").str();
  if (status.type() != llvm::sys::fs::file_type::regular_file)
    return (what + " '" + path + "' is not a regular file").str();
  return "";
}

/// The deepest nesting of { ( [ < in MLIR text, outside strings and
/// comments (the -> arrow's > closes nothing); stops once past `limit`.
/// A pre-scan, because MLIR 22's parser has no nesting bound of its own.
static int64_t mlirNesting(llvm::StringRef text, int64_t limit) {
  int64_t depth = 0, deepest = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      i = text.find('\n', i);
      if (i == llvm::StringRef::npos)
        break;
    } else if (c == '{' || c == '(' || c == '[' || c == '<') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit)
        break;
    } else if (c == '}' || c == ')' || c == ']' ||
               (c == '>' && !(i > 0 && text[i - 1] == '-'))) {
      if (depth > 0)
        --depth;
    }
  }
  return deepest;
}

/// "" when the model text nests within kMaxMlirNesting, else the error.
std::string checkMlirNesting(llvm::StringRef text, llvm::StringRef what,
                             llvm::StringRef path) {
  if (mlirNesting(text, kMaxMlirNesting) <= kMaxMlirNesting)
    return "";
  return llvm::formatv("{0} '{1}' nests brackets or regions more than {2} "
                       "levels deep",
                       what, path, kMaxMlirNesting)
      .str();
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
  out->keep();
  return 0;
}

OwningOpRef<ModuleOp> loadModule(MLIRContext &ctx, llvm::SourceMgr &sourceMgr,
                                 const std::string &path, llvm::StringRef what,
                                 llvm::StringRef verb, std::string &error) {
  auto file = openInputFile(path, &error);
  if (!file)
    return nullptr;
  if (std::string err = checkMlirNesting(file->getBuffer(), what, path);
      !err.empty()) {
    error = err;
    return nullptr;
  }
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
