// One directive by kind (piper-apply-directive, which the directive
// pipeline runs per directive), the passes of the directives that rewrite
// the forward model (piper-recompute, piper-shard-tensor,
// piper-context-parallel: their options typed, no JSON) and whole strategy
// files (piper-apply-strategy).
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERAPPLYSTRATEGY
#define GEN_PASS_DEF_PIPERAPPLYDIRECTIVE
#define GEN_PASS_DEF_PIPERRECOMPUTE
#define GEN_PASS_DEF_PIPERSHARDTENSOR
#define GEN_PASS_DEF_PIPERCONTEXTPARALLEL
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

LogicalResult mlir::piper::applyDirective(ModuleOp module, const Directive &d,
                                          std::optional<int64_t> worldSize) {
  if (llvm::Error err = verifyDirective(d))
    return module.emitError(llvm::toString(std::move(err)));
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  switch (d.kind()) {
  case Directive::Stage:
    return applyStage(module, d.get<StageOptions>().stages);
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
  case Directive::Schedule:
    // The verifier has found the schedule.
    return applySchedule(module, *findSchedule(d.get<ScheduleOptions>().name),
                         d.describe());
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
      llvm::Expected<Strategy> strategy = parseStrategy("[" + directive + "]");
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

/// The filter of a forward-model directive's `block` option: that block,
/// or (-1) every transformer block.
static Filter blockFilter(int64_t block) {
  Filter filter;
  if (block != -1)
    filter.entries["block"] = {FilterValue::Index, block, ""};
  return filter;
}

/// Applies the directive a typed pass stands for, verified as a
/// strategy's are.
static LogicalResult runDirective(ModuleOp module, Directive::Options options,
                                  std::string text, Filter filter = {}) {
  return applyDirective(
      module, Directive(std::move(options), std::move(text), std::move(filter)),
      std::nullopt);
}

/// " block=3", or "" for every block.
static std::string blockText(int64_t block) {
  return block == -1 ? "" : " block=" + std::to_string(block);
}

struct RecomputePass : mlir::piper::impl::PiperRecomputeBase<RecomputePass> {
  using PiperRecomputeBase::PiperRecomputeBase;
  void runOnOperation() override {
    RecomputeOptions o;
    o.granularity = granularity;
    if (failed(runDirective(getOperation(), o,
                            ("piper-recompute granularity=" +
                             stringify(o.granularity) + blockText(block))
                                .str(),
                            blockFilter(block))))
      signalPassFailure();
  }
};

struct ShardTensorPass
    : mlir::piper::impl::PiperShardTensorBase<ShardTensorPass> {
  using PiperShardTensorBase::PiperShardTensorBase;
  void runOnOperation() override {
    ShardTensorOptions o;
    o.tp = tp;
    o.sequenceParallel = sequenceParallel;
    o.vocabParallel = vocabParallel;
    o.stream = stream;
    if (failed(runDirective(getOperation(), o,
                            "piper-shard-tensor tp=" + std::to_string(o.tp) +
                                blockText(block),
                            blockFilter(block))))
      signalPassFailure();
  }
};

struct ContextParallelPass
    : mlir::piper::impl::PiperContextParallelBase<ContextParallelPass> {
  using PiperContextParallelBase::PiperContextParallelBase;
  void runOnOperation() override {
    ContextParallelOptions o;
    o.cp = cp;
    o.kind = kind;
    o.overlap = overlap;
    o.stream = stream;
    if (failed(
            runDirective(getOperation(), o,
                         ("piper-context-parallel cp=" + std::to_string(o.cp) +
                          " kind=" + stringify(o.kind))
                             .str())))
      signalPassFailure();
  }
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

namespace {
/// A strategy's order directives (the directive pipeline's), applied in
/// one pass: their edges, then one sort (applyOrders).
struct ApplyOrderDirectivesPass
    : PassWrapper<ApplyOrderDirectivesPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(ApplyOrderDirectivesPass)
  explicit ApplyOrderDirectivesPass(std::vector<Directive> directives)
      : directives(std::move(directives)) {}
  // The directive phase's pass, as the one-directive passes are.
  StringRef getArgument() const override { return "piper-apply-directive"; }
  StringRef getName() const override { return "PiperApplyDirective(order)"; }
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<const Directive *> ds;
    for (const Directive &d : directives) {
      if (llvm::Error err = verifyDirective(d)) {
        module.emitError(llvm::toString(std::move(err)));
        return signalPassFailure();
      }
      ds.push_back(&d);
    }
    FailureOr<ProgramOp> program = getProgram(module);
    if (failed(program) || failed(applyOrders(*program, ds)))
      signalPassFailure();
  }
  std::vector<Directive> directives;
};
} // namespace

std::unique_ptr<Pass>
mlir::piper::createApplyOrderDirectivesPass(std::vector<Directive> directives) {
  return std::make_unique<ApplyOrderDirectivesPass>(std::move(directives));
}
