// The `mlir` fuzz target (Targets.h): MLIR text through piperc's pre-scan
// and, when the scan lets it through, MLIR's parser, the verifier and the
// printer, as piper-opt runs them. The oracle: nothing the scan accepts may
// nest deeper than the scan promises, so a gap in the scan shows on inputs
// far smaller than a stack overflow needs.
#include "test/fuzz/Targets.h"

#include <algorithm>
#include <vector>

#include "compiler/driver/MlirScan.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/raw_ostream.h"

namespace piper::fuzz {
namespace {

using mlir::piper::driver::kMaxMlirNesting;

/// The deepest nesting of attributes and types under `root`, without
/// recursion; memoized over everything seen.
class DepthMeter {
public:
  int64_t depthOf(const void *root, bool isType) {
    struct Item {
      const void *node;
      bool isType, expanded;
    };
    std::vector<Item> stack = {{root, isType, false}};
    while (!stack.empty()) {
      Item item = stack.back();
      if (depth.count(item.node)) {
        stack.pop_back();
        continue;
      }
      std::vector<std::pair<const void *, bool>> children = childrenOf(item);
      if (!item.expanded) {
        stack.back().expanded = true;
        for (auto [child, childIsType] : children)
          if (!depth.count(child))
            stack.push_back({child, childIsType, false});
        continue;
      }
      int64_t deepest = 0;
      for (auto [child, childIsType] : children)
        deepest = std::max(deepest, depth.lookup(child));
      depth[item.node] = deepest + 1;
      stack.pop_back();
    }
    return depth.lookup(root);
  }

private:
  template <typename Item>
  std::vector<std::pair<const void *, bool>> childrenOf(const Item &item) {
    std::vector<std::pair<const void *, bool>> children;
    auto addAttr = [&](mlir::Attribute a) {
      children.push_back({a.getAsOpaquePointer(), false});
    };
    auto addType = [&](mlir::Type t) {
      children.push_back({t.getAsOpaquePointer(), true});
    };
    if (item.isType)
      mlir::Type::getFromOpaquePointer(item.node).walkImmediateSubElements(
          addAttr, addType);
    else
      mlir::Attribute::getFromOpaquePointer(item.node).walkImmediateSubElements(
          addAttr, addType);
    return children;
  }

  llvm::DenseMap<const void *, int64_t> depth;
};

/// Traps when the parsed module nests deeper than the scan allows: twice
/// the limit (a forward-referenced location alias adds its own nesting).
void checkNesting(mlir::ModuleOp module) {
  const int64_t bound = 2 * kMaxMlirNesting + 2;
  DepthMeter meter;
  module->walk([&](mlir::Operation *op) {
    int64_t regions = 0;
    for (mlir::Operation *p = op; p; p = p->getParentOp())
      ++regions;
    int64_t attrs =
        meter.depthOf(op->getAttrDictionary().getAsOpaquePointer(), false);
    int64_t loc = meter.depthOf(op->getLoc().getAsOpaquePointer(), false);
    int64_t types = 0;
    for (mlir::Type t : op->getResultTypes())
      types = std::max(types, meter.depthOf(t.getAsOpaquePointer(), true));
    if (regions > bound || attrs > bound || loc > bound || types > bound)
      __builtin_trap();
  });
}

} // namespace

Result fuzzMlir(const uint8_t *data, size_t size) {
  // MLIR's lexer reads the NUL after the text that every MemoryBuffer of
  // piperc and piper-opt has; the fuzzer's bytes have none.
  std::string text(reinterpret_cast<const char *>(data), size);
  if (std::string err = mlir::piper::driver::scanMlirText(text); !err.empty())
    return err;
  // One context for many inputs (creating one costs more than a parse),
  // renewed now and then: it keeps every attribute and type it made.
  static std::unique_ptr<mlir::MLIRContext> ctx;
  static int uses = 0;
  if (!ctx || ++uses % 1000 == 0) {
    ctx = std::make_unique<mlir::MLIRContext>(
        mlir::MLIRContext::Threading::DISABLED);
    ctx->allowUnregisteredDialects();
    ctx->printOpOnDiagnostic(false);
    ctx->getDiagEngine().registerHandler(
        [](mlir::Diagnostic &) { return mlir::success(); });
  }
  mlir::ParserConfig config(ctx.get());
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(text, config);
  if (!module)
    return "does not parse";
  checkNesting(*module);
  bool verifies = mlir::succeeded(mlir::verify(*module));
  std::string printed;
  llvm::raw_string_ostream os(printed);
  module->print(os, mlir::OpPrintingFlags().enableDebugInfo());
  return verifies ? "" : "does not verify";
}

} // namespace piper::fuzz
