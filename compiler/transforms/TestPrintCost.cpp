// -test-print-cost: prints each segment's FLOPs and bytes moved
// (CostOpInterface), for FileCheck.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "llvm/Support/FormatVariadic.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERTESTPRINTCOST
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

namespace {
struct TestPrintCostPass
    : mlir::piper::impl::PiperTestPrintCostBase<TestPrintCostPass> {
  void runOnOperation() override {
    for (SegmentOp seg : getOperation().getOps<SegmentOp>()) {
      SegmentCost cost = estimateSegmentCost(seg);
      llvm::outs() << llvm::formatv(
          "segment @{0}: flops {1:F0}, bytes {2:F0}\n", seg.getSymName(),
          cost.flops, cost.bytes);
    }
    markAllAnalysesPreserved();
  }
};
} // namespace
