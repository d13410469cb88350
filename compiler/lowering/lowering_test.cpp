// Unit tests of the lowering to plans: every kernel it emits is checked
// against the kernel table (proto/KernelIds.h), and an op with no kernel
// there is an error naming the op.
#include <catch2/catch.hpp>

#include <string>

#include "compiler/lowering/LowerToPlan.h"
#include "dialects/piper/PiperDialect.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "proto/KernelIds.h"

using namespace mlir;
using namespace mlir::piper;

namespace {

/// A one-rank device program running segment @f once, whose body is `body`
/// (from %x, parameter @w: tensor<2x4xf32>, to %y: tensor<2x4xf32>).
std::string program(const std::string &body) {
  return R"(
piper.param @w : tensor<2x4xf32> init zeros(0.0)
piper.segment @f() -> tensor<2x4xf32> {
  %x = piper.param_ref @w : tensor<2x4xf32>
)" + body +
         R"(
  piper.yield %y : tensor<2x4xf32>
}
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %y, %yd = piper.task @f() {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : () -> (tensor<2x4xf32>, !piper.token)
}
)";
}

/// Lowers `source`; returns the diagnostics, and the plan of class 0 in
/// `plan` when the lowering succeeds.
std::string lower(const std::string &source, bool &ok, plan::Plan &plan) {
  MLIRContext ctx;
  ctx.loadDialect<PiperDialect>();
  ctx.allowUnregisteredDialects();
  ctx.printOpOnDiagnostic(false);
  std::string diagnostics;
  ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &d) {
    diagnostics += d.str() + "\n";
    return success();
  });
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(source, &ctx);
  REQUIRE(module);
  FailureOr<LoweredPlans> lowered = lowerToPlans(*module, "test", "test");
  ok = succeeded(lowered);
  if (ok) {
    REQUIRE(lowered->plans.size() == 1);
    plan = lowered->plans[0];
  }
  return diagnostics;
}

} // namespace

TEST_CASE("the lowering emits kernels of the kernel table", "[lowering]") {
  bool ok = false;
  plan::Plan plan;
  std::string diags =
      lower(program("  %y = piper.gelu %x : tensor<2x4xf32>"), ok, plan);
  INFO(diags);
  REQUIRE(ok);
  REQUIRE(plan.segments_size() == 1);
  REQUIRE(plan.segments(0).kernels_size() == 1);
  CHECK(plan.segments(0).kernels(0).op() == "gelu");
  CHECK(plan::checkKernelSignature(plan.segments(0).kernels(0)) == "");
}

TEST_CASE("the lowering rejects an op with no kernel, naming it",
          "[lowering]") {
  bool ok = true;
  plan::Plan plan;
  std::string diags =
      lower(program("  %y = \"test.conv2d\"(%x) : (tensor<2x4xf32>) -> "
                    "tensor<2x4xf32>"),
            ok, plan);
  CHECK_FALSE(ok);
  CHECK(diags == "'test.conv2d' op cannot be lowered to a plan kernel: "
                 "unknown kernel 'conv2d'\n");
}
