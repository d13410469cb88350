// One directive by kind (piper-apply-directive, which the directive
// pipeline runs per directive) and whole strategy files
// (piper-apply-strategy).
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERAPPLYSTRATEGY
#define GEN_PASS_DEF_PIPERAPPLYDIRECTIVE
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

LogicalResult mlir::piper::applyDirective(ModuleOp module, const Directive &d,
                                          std::optional<int64_t> worldSize) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  switch (d.kind) {
  case Directive::Stage:
    return applyStage(module, d.stages);
  case Directive::Split:
    return applySplit(*program, d);
  case Directive::Place:
    return applyPlace(*program, d, worldSize);
  case Directive::Replicate:
    return applyReplicate(module, *program, d, worldSize);
  case Directive::Shard:
    return applyShard(module, *program, d);
  case Directive::Recompute:
    return applyRecompute(module, *program, d);
  case Directive::ShardTensor:
    return applyShardTensor(module, *program, d);
  case Directive::ContextParallel:
    return applyContextParallel(module, *program, d);
  case Directive::Order:
    return applyOrder(*program, d);
  case Directive::Schedule: {
    const ScheduleBuilder *schedule = findSchedule(d.schedule);
    if (!schedule)
      return program->emitOpError(d.describe())
             << ": unknown schedule '" << d.schedule << "' (expected "
             << scheduleNames() << ")";
    return applySchedule(module, *schedule, d.describe());
  }
  }
  return failure();
}


namespace {
/// One directive: parsed from its `directive` option (piper-opt), or given
/// parsed (the directive pipeline, which keeps its index and text).
struct ApplyDirectivePass
    : mlir::piper::impl::PiperApplyDirectiveBase<ApplyDirectivePass> {
  using PiperApplyDirectiveBase::PiperApplyDirectiveBase;
  ApplyDirectivePass(Directive d, std::optional<int64_t> world)
      : parsed(std::move(d)) {
    directive = parsed->text;
    worldSize = world.value_or(0);
    name = ("PiperApplyDirective(" + parsed->kindName() + ")").str();
  }

  /// Timing reports and IR dumps say which kind of directive each is.
  StringRef getName() const override {
    return name.empty() ? PiperApplyDirectiveBase::getName() : name;
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!parsed) {
      llvm::Expected<Strategy> strategy =
          parseStrategy("[" + directive + "]");
      if (!strategy) {
        module.emitError("piper-apply-directive: ")
            << llvm::toString(strategy.takeError());
        return signalPassFailure();
      }
      if (strategy->directives.size() != 1) {
        module.emitError("piper-apply-directive: expected one directive, "
                         "got ")
            << strategy->directives.size();
        return signalPassFailure();
      }
      parsed = std::move(strategy->directives.front());
    }
    std::optional<int64_t> world;
    if (worldSize > 0)
      world = worldSize;
    if (failed(applyDirective(module, *parsed, world)))
      signalPassFailure();
  }

  std::optional<Directive> parsed;
  std::string name;
};

/// A whole strategy file on a forward model: the compile pipeline up to the
/// directive phase, run as a dynamic pipeline.
struct ApplyStrategyPass
    : mlir::piper::impl::PiperApplyStrategyBase<ApplyStrategyPass> {
  using PiperApplyStrategyBase::PiperApplyStrategyBase;
  void runOnOperation() override {
    llvm::Expected<Strategy> strategy = readStrategyFile(file);
    if (!strategy) {
      getOperation().emitError(llvm::toString(strategy.takeError()));
      return signalPassFailure();
    }
    if (worldSize > 0)
      strategy->worldSize = worldSize;
    OpPassManager pm(ModuleOp::getOperationName());
    addCompilePipeline(pm, *strategy, OptimizerConfig(),
                       CompilePhase::Directives);
    if (failed(runPipeline(pm, getOperation())))
      signalPassFailure();
  }
};
} // namespace

std::unique_ptr<Pass>
mlir::piper::createApplyDirectivePass(Directive directive,
                                      std::optional<int64_t> worldSize) {
  return std::make_unique<ApplyDirectivePass>(std::move(directive), worldSize);
}
