// Pass wrappers around the program rewrites of Transforms.h.
#include "compiler/transforms/Passes.h"

#include "compiler/transforms/Transforms.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERSTAGE
#define GEN_PASS_DEF_PIPERBUILDTRAININGDAG
#define GEN_PASS_DEF_PIPERSPLIT
#define GEN_PASS_DEF_PIPERPLACE
#define GEN_PASS_DEF_PIPERREPLICATE
#define GEN_PASS_DEF_PIPERTIEPARAMS
#define GEN_PASS_DEF_PIPERSCHEDULE
#define GEN_PASS_DEF_PIPERAPPLYSTRATEGY
#define GEN_PASS_DEF_PIPERSPLITDEVICES
#define GEN_PASS_DEF_PIPERORDERSTREAMS
#define GEN_PASS_DEF_PIPERTESTPRINTCOST
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

namespace {
Directive stageDirective(Directive::Kind kind, int64_t pp,
                         ArrayRef<int64_t> devices, StringRef passName) {
  Directive d;
  d.kind = kind;
  d.filter.entries["PP"] = {FilterValue::Index, pp, ""};
  d.devices.assign(devices.begin(), devices.end());
  d.text = (passName + " pp=" + std::to_string(pp)).str();
  return d;
}

struct StagePass : mlir::piper::impl::PiperStageBase<StagePass> {
  using PiperStageBase::PiperStageBase;
  void runOnOperation() override {
    if (failed(applyStage(getOperation(), stages)))
      signalPassFailure();
  }
};

struct BuildTrainingDagPass
    : mlir::piper::impl::PiperBuildTrainingDagBase<BuildTrainingDagPass> {
  using PiperBuildTrainingDagBase::PiperBuildTrainingDagBase;
  void runOnOperation() override {
    OptimizerConfig opt;
    opt.lr = lr;
    opt.beta1 = beta1;
    opt.beta2 = beta2;
    opt.eps = eps;
    opt.weightDecay = weightDecay;
    opt.minLr = minLr;
    opt.warmupSteps = warmupSteps;
    opt.decaySteps = decaySteps;
    opt.clipGradNorm = clipGradNorm;
    opt.noUpdate = noOptimizer;
    opt.dtype = dtype;
    if (failed(buildTrainingDag(getOperation(), opt)))
      signalPassFailure();
  }
};

struct SplitPass : mlir::piper::impl::PiperSplitBase<SplitPass> {
  using PiperSplitBase::PiperSplitBase;
  void runOnOperation() override {
    Directive d;
    d.kind = Directive::Split;
    d.numMicrobatches = microbatches;
    d.text = "piper-split microbatches=" + std::to_string(microbatches);
    if (microbatches < 1) {
      getOperation().emitError("piper-split: microbatches must be positive");
      return signalPassFailure();
    }
    if (failed(applyDirective(getOperation(), d, std::nullopt)))
      signalPassFailure();
  }
};

struct PlacePass : mlir::piper::impl::PiperPlaceBase<PlacePass> {
  using PiperPlaceBase::PiperPlaceBase;
  void runOnOperation() override {
    Directive d =
        stageDirective(Directive::Place, pp, devices, "piper-place");
    d.stream = stream;
    if (failed(verifyDeviceGroup(devices, "piper-place devices", [&] {
          return getOperation().emitError();
        })))
      return signalPassFailure();
    if (failed(applyDirective(getOperation(), d, std::nullopt)))
      return signalPassFailure();
    // Transfers are inserted once the last stage has been placed.
    FailureOr<ProgramOp> program = getProgram(getOperation());
    bool allPlaced = true;
    for (TaskOp t : program->getBody().front().getOps<TaskOp>())
      allPlaced &= bool(t.getDevices());
    if (allPlaced && failed(finalizePlacement(getOperation(), std::nullopt)))
      signalPassFailure();
  }
};

struct ReplicatePass : mlir::piper::impl::PiperReplicateBase<ReplicatePass> {
  using PiperReplicateBase::PiperReplicateBase;
  void runOnOperation() override {
    if (failed(verifyDeviceGroup(devices, "piper-replicate devices", [&] {
          return getOperation().emitError();
        })))
      return signalPassFailure();
    Directive d = stageDirective(Directive::Replicate, pp, devices,
                                 "piper-replicate");
    d.bucketSizeMb = bucketMb;
    d.reduceStream = reduceStream;
    if (failed(applyDirective(getOperation(), d, std::nullopt)))
      signalPassFailure();
  }
};

struct TieParamsPass
    : mlir::piper::impl::PiperTieParamsBase<TieParamsPass> {
  void runOnOperation() override {
    if (failed(tieSharedParams(getOperation())))
      signalPassFailure();
  }
};

struct SchedulePass : mlir::piper::impl::PiperScheduleBase<SchedulePass> {
  using PiperScheduleBase::PiperScheduleBase;
  void runOnOperation() override {
    const ScheduleBuilder *s = findSchedule(schedule);
    if (!s) {
      getOperation().emitError("unknown schedule '")
          << schedule << "' (expected " << scheduleNames() << ")";
      return signalPassFailure();
    }
    if (failed(applySchedule(getOperation(), *s, "piper-schedule")))
      return signalPassFailure();
  }
};

struct ApplyStrategyPass : mlir::piper::impl::PiperApplyStrategyBase<ApplyStrategyPass> {
  using PiperApplyStrategyBase::PiperApplyStrategyBase;
  void runOnOperation() override {
    auto buffer = llvm::MemoryBuffer::getFile(file);
    if (!buffer) {
      getOperation().emitError("cannot read strategy file '")
          << file << "': " << buffer.getError().message();
      return signalPassFailure();
    }
    llvm::Expected<Strategy> strategy =
        parseStrategy((*buffer)->getBuffer());
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

struct SplitDevicesPass : mlir::piper::impl::PiperSplitDevicesBase<SplitDevicesPass> {
  void runOnOperation() override {
    if (failed(splitDevices(getOperation())))
      signalPassFailure();
  }
};

struct OrderStreamsPass : mlir::piper::impl::PiperOrderStreamsBase<OrderStreamsPass> {
  void runOnOperation() override {
    if (failed(orderStreams(getOperation())))
      signalPassFailure();
  }
};
} // namespace

namespace {
struct TestPrintCostPass
    : mlir::piper::impl::PiperTestPrintCostBase<TestPrintCostPass> {
  void runOnOperation() override {
    for (SegmentOp seg : getOperation().getOps<SegmentOp>()) {
      double flops = 0, bytes = 0;
      seg.walk([&](Operation *op) {
        if (op == seg.getOperation())
          return;
        flops += estimateFlops(op);
        if (auto cost = dyn_cast<CostOpInterface>(op))
          bytes += cost.getBytesMoved();
      });
      llvm::outs() << llvm::formatv("segment @{0}: flops {1:F0}, bytes {2:F0}\n",
                                    seg.getSymName(), flops, bytes);
    }
    markAllAnalysesPreserved();
  }
};
} // namespace

namespace {
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

ArrayRef<StringRef> mlir::piper::getCompilePhases() {
  static const StringRef phases[] = {"stage",   "training-dag", "directives",
                                     "devices", "streams",      "plan"};
  return phases;
}

void mlir::piper::addCompilePipeline(OpPassManager &pm,
                                     const Strategy &strategy,
                                     const OptimizerConfig &opt,
                                     StringRef lastPhase) {
  ArrayRef<StringRef> phases = getCompilePhases();
  size_t last = llvm::find(phases, lastPhase) - phases.begin();
  auto wants = [&](StringRef phase) {
    return size_t(llvm::find(phases, phase) - phases.begin()) <= last;
  };
  if (wants("stage"))
    pm.addPass(createPiperStage(PiperStageOptions{numStages(strategy)}));
  if (wants("training-dag")) {
    PiperBuildTrainingDagOptions o;
    o.lr = opt.lr;
    o.beta1 = opt.beta1;
    o.beta2 = opt.beta2;
    o.eps = opt.eps;
    o.weightDecay = opt.weightDecay;
    o.minLr = opt.minLr;
    o.warmupSteps = opt.warmupSteps;
    o.decaySteps = opt.decaySteps;
    o.clipGradNorm = opt.clipGradNorm;
    o.dtype = opt.dtype;
    o.noOptimizer = opt.noUpdate;
    pm.addPass(createPiperBuildTrainingDag(o));
  }
  if (wants("directives"))
    pm.addPass(std::make_unique<ApplyDirectivesPass>(strategy));
  if (wants("devices"))
    addLowerToDevicesPipeline(pm, /*orderStreams=*/wants("streams"));
}

void mlir::piper::addLowerToDevicesPipeline(OpPassManager &pm,
                                            bool orderStreams) {
  pm.addPass(createPiperSplitDevices());
  if (orderStreams)
    pm.addPass(createPiperOrderStreams());
}

void mlir::piper::registerPiperCompilerPasses() {
  registerPiperPasses();
  PassPipelineRegistration<>(
      "piper-lower-to-devices-pipeline",
      "Split a placed training DAG into device programs and fix their issue "
      "order (piper-split-devices, piper-order-streams)",
      [](OpPassManager &pm) { addLowerToDevicesPipeline(pm); });
}
