// Whole strategies: one directive by kind, the phase order of a strategy's
// directives, and the piper-apply-strategy pass.
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


/// The directives of `strategy` of one kind, in order.
static SmallVector<const Directive *> directivesOfKind(const Strategy &strategy,
                                                       Directive::Kind kind) {
  SmallVector<const Directive *> out;
  for (const Directive &d : strategy.directives)
    if (d.kind == kind)
      out.push_back(&d);
  return out;
}

/// A strategy has at most one stage directive.
static LogicalResult checkOneStage(ModuleOp module, const Strategy &strategy) {
  if (auto st = directivesOfKind(strategy, Directive::Stage); st.size() > 1)
    return module.emitError(st[1]->describe())
           << ": only one stage directive is allowed";
  return success();
}

LogicalResult mlir::piper::applyStrategy(ModuleOp module,
                                         const Strategy &strategy,
                                         const OptimizerConfig &opt) {
  if (failed(checkOneStage(module, strategy)))
    return failure();
  int64_t stages = numStages(strategy);
  if (failed(applyStage(module, stages)) ||
      failed(buildTrainingDag(module, opt)))
    return failure();
  return applyDirectives(module, strategy);
}

LogicalResult mlir::piper::applyDirectives(ModuleOp module,
                                           const Strategy &strategy) {
  auto ofKind = [&](Directive::Kind kind) {
    return directivesOfKind(strategy, kind);
  };
  if (failed(checkOneStage(module, strategy)))
    return failure();
  SmallVector<const Directive *> splits = ofKind(Directive::Split);
  if (splits.size() > 1)
    return module.emitError(splits[1]->describe())
           << ": only one split directive is allowed";
  Directive one;
  one.kind = Directive::Split;
  one.numMicrobatches = 1;
  one.text = "implicit split num_microbatches=1";
  if (failed(applyDirective(module, splits.empty() ? one : *splits.front(),
                            strategy.worldSize)))
    return failure();
  // shard before replicate: it makes expert weights local, and replicate
  // reduces their gradients over the ranks holding the same experts.
  for (Directive::Kind kind : {Directive::Place, Directive::Shard,
                               Directive::Replicate, Directive::Order,
                               Directive::Schedule}) {
    for (const Directive *d : ofKind(kind))
      if (failed(applyDirective(module, *d, strategy.worldSize)))
        return failure();
    if (kind == Directive::Place &&
        failed(finalizePlacement(module, strategy.worldSize)))
      return failure();
    if (kind == Directive::Replicate && failed(tieSharedParams(module)))
      return failure();
  }
  return boundZeroCollectives(module);
}

namespace {
struct ApplyStrategyPass : mlir::piper::impl::PiperApplyStrategyBase<ApplyStrategyPass> {
  using PiperApplyStrategyBase::PiperApplyStrategyBase;
  void runOnOperation() override {
    llvm::Expected<Strategy> strategy = readStrategyFile(file);
    if (!strategy) {
      getOperation().emitError(llvm::toString(strategy.takeError()));
      return signalPassFailure();
    }
    if (worldSize > 0)
      strategy->worldSize = worldSize;
    if (failed(applyStrategy(getOperation(), *strategy, OptimizerConfig())))
      signalPassFailure();
  }
};

/// The directives of a strategy built in C++ (piperc's flags, or a parsed
/// file), after stage and autodiff: the pass piperc runs where piper-opt
/// runs piper-apply-strategy on a file.
struct ApplyDirectivesPass
    : PassWrapper<ApplyDirectivesPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(ApplyDirectivesPass)
  explicit ApplyDirectivesPass(Strategy strategy)
      : strategy(std::move(strategy)) {}
  StringRef getArgument() const override { return "piper-apply-directives"; }
  StringRef getName() const override { return "PiperApplyDirectives"; }
  StringRef getDescription() const override {
    return "Apply a strategy's split, place, replicate, order and schedule "
           "directives";
  }
  void runOnOperation() override {
    if (failed(applyDirectives(getOperation(), strategy)))
      signalPassFailure();
  }
  Strategy strategy;
};
} // namespace

std::unique_ptr<Pass>
mlir::piper::createApplyDirectivesPass(Strategy strategy) {
  return std::make_unique<ApplyDirectivesPass>(std::move(strategy));
}
