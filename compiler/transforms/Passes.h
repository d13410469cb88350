// Declarations and registration of the piper passes and pipelines.
#ifndef PIPER_COMPILER_TRANSFORMS_PASSES_H
#define PIPER_COMPILER_TRANSFORMS_PASSES_H

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

#include "compiler/transforms/Transforms.h"

namespace mlir::piper {

#define GEN_PASS_DECL
#include "compiler/transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "compiler/transforms/Passes.h.inc"

/// The pass piperc runs for a strategy built in C++ (its flags, or a parsed
/// file) after stage and autodiff: the strategy's split, place, replicate,
/// order and schedule directives (piper-opt runs piper-apply-strategy on a
/// file instead).
std::unique_ptr<Pass> createApplyDirectivesPass(Strategy strategy);

/// Registers every piper pass and pipeline (the one entry point shared by
/// piper-opt and piperc).
void registerPiperCompilerPasses();

/// The phases of `piperc compile`, in pipeline order; `--compile-to PHASE`
/// stops after one ("plan" runs them all, then lowers to plans).
ArrayRef<StringRef> getCompilePhases();

/// The passes of every compile phase up to and including `lastPhase`: stage,
/// autodiff, the strategy's directives, then the lower-to-devices pipeline.
/// piperc runs exactly this.
void addCompilePipeline(OpPassManager &pm, const Strategy &strategy,
                        const OptimizerConfig &opt, StringRef lastPhase);

/// piper-lower-to-devices-pipeline: the per-device split, then the issue
/// order of every stream and the deadlock check. With `orderStreams` false,
/// only the split (what `piperc --compile-to devices` stops after).
void addLowerToDevicesPipeline(OpPassManager &pm, bool orderStreams = true);

} // namespace mlir::piper

#endif // PIPER_COMPILER_TRANSFORMS_PASSES_H
