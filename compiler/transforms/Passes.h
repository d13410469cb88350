// Declarations and registration of the piper passes and pipelines.
#ifndef PIPER_COMPILER_TRANSFORMS_PASSES_H
#define PIPER_COMPILER_TRANSFORMS_PASSES_H

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

#include <optional>

#include "compiler/transforms/Transforms.h"

namespace mlir::piper {

#define GEN_PASS_DECL
#include "compiler/transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "compiler/transforms/Passes.h.inc"

/// The phases of `piperc compile`, in pipeline order; `--compile-to PHASE`
/// stops after one (Plan runs them all, then lowers to plans).
enum class CompilePhase {
  Stage,
  TrainingDag,
  Directives,
  Devices,
  Streams,
  Plan
};

/// "stage", "training-dag", "directives", "devices", "streams", "plan".
StringRef stringifyCompilePhase(CompilePhase phase);
/// The phase named `name`, or none.
std::optional<CompilePhase> symbolizeCompilePhase(StringRef name);
/// Every phase name in order, "stage, training-dag, ..., plan".
std::string compilePhaseNames();
/// What a phase does, for "piperc: error: <it> failed": "stage",
/// "autodiff", "applying the strategy", "per-device split", "stream
/// ordering", "lowering to plans".
StringRef describeCompilePhase(CompilePhase phase);
/// The phase whose pipeline adds the pass with command-line `argument`, or
/// none for a pass the compile pipeline never adds.
std::optional<CompilePhase> compilePhaseOfPass(StringRef argument);

/// The piper-apply-directive pass for a directive already parsed (or built
/// from piperc's flags): its index and text stay in its diagnostics.
std::unique_ptr<Pass>
createApplyDirectivePass(Directive directive,
                         std::optional<int64_t> worldSize = std::nullopt);

/// One pass applying order directives `directives` (parsed, in their
/// order) with one sort of the program after all of them (applyOrders);
/// the directive pipeline's.
std::unique_ptr<Pass>
createApplyOrderDirectivesPass(std::vector<Directive> directives);

/// Registers every piper pass and pipeline (the one entry point shared by
/// piper-opt and piperc).
void registerPiperCompilerPasses();

/// piper-directives-pipeline: the directive phase of `strategy`, after
/// stage and autodiff. One piper-apply-directive per directive, in phase
/// order: split (an implicit one microbatch when the strategy has none),
/// place, then piper-finalize-placement, shard, replicate, then
/// piper-tie-params, the order directives (one pass for all of them),
/// schedule, then piper-bound-zero-collectives.
/// A strategy with two stage or two split directives gets a pipeline that
/// fails with a message naming the second one.
void addDirectivesPipeline(OpPassManager &pm, const Strategy &strategy);

/// The passes of every compile phase up to and including `lastPhase`
/// (Plan: the same as Streams): piper-stage, piper-build-training-dag, the
/// directive pipeline, then the lower-to-devices pipeline. piperc runs
/// exactly this.
void addCompilePipeline(OpPassManager &pm, const Strategy &strategy,
                        const OptimizerConfig &opt, CompilePhase lastPhase);

/// piper-lower-to-devices-pipeline: the per-device split, then the issue
/// order of every stream and the deadlock check. With `orderStreams` false,
/// only the split (what `piperc --compile-to devices` stops after).
void addLowerToDevicesPipeline(OpPassManager &pm, bool orderStreams = true);

} // namespace mlir::piper

#endif // PIPER_COMPILER_TRANSFORMS_PASSES_H
