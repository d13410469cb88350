// `piperc lower PROGRAM.mlir -o OUT/`: plans from a hand-written training
// program. The input is a placed `piper.program` (every task has its
// devices, transfers and collectives are explicit); lowering splits it per
// device class, orders its streams (a deadlock is an error), lays out the
// memory and writes the plans and the manifest, as `piperc compile` does
// after applying a strategy.
#include "compiler/driver/DriverSupport.h"
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"
#include "dialects/piper/PiperDialect.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "proto/analysis/MemoryPlan.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"

namespace mlir::piper::driver {

int runLower(const LowerOptions &o) {
  if (o.input.empty())
    return fail("name a program .mlir file to lower");
  if (o.output.empty())
    return fail("-o OUT/ is required to write plans");
  if (std::string err = checkRegularFile(o.input, "program"); !err.empty())
    return fail(err);
  MLIRContext ctx;
  ctx.getOrLoadDialect<PiperDialect>();
  ctx.printOpOnDiagnostic(false);
  llvm::SourceMgr sourceMgr;
  SourceMgrDiagnosticHandler handler(sourceMgr, &ctx);
  std::string error;
  OwningOpRef<ModuleOp> module =
      loadModule(ctx, sourceMgr, o.input, "program", "lower", error);
  if (!module)
    return fail(error);
  if (llvm::range_size(module->getOps<ProgramOp>()) != 1)
    return fail("program '" + o.input +
                "' must hold exactly one piper.program (a placed training "
                "DAG)");
  PassManager pm(&ctx);
  addLowerToDevicesPipeline(pm);
  if (failed(pm.run(*module)))
    return fail("splitting and ordering the program failed");
  FailureOr<LoweredPlans> lowered =
      lowerToPlans(*module, llvm::sys::path::stem(o.input).str(),
                   "hand-written program", /*checkProgress=*/true,
                   /*fuseKernels=*/true, /*padVocab=*/64);
  if (failed(lowered))
    return fail("lowering to plans failed");
  if (std::string err = writePlans(*lowered, o.output); !err.empty())
    return fail(err);
  llvm::outs() << "piperc: wrote " << lowered->plans.size() << " plan(s) for "
               << lowered->manifest.world_size() << " device(s) to " << o.output
               << "\n";
  return 0;
}

} // namespace mlir::piper::driver
