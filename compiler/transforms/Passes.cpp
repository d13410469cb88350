// The piper pass pipelines (the compile pipeline piperc and piper-opt share,
// lower-to-devices) and their registration. Each pass lives in the file of
// the rewrite it runs.
#include "compiler/transforms/Passes.h"

#include "compiler/transforms/Transforms.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;
using namespace mlir::piper;

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
    pm.addPass(createApplyDirectivesPass(strategy));
  if (wants("devices"))
    addLowerToDevicesPipeline(pm, /*orderStreams=*/wants("streams"));
}

void mlir::piper::addLowerToDevicesPipeline(OpPassManager &pm,
                                            bool orderStreams) {
  pm.addPass(createPiperSplitDevices());
  if (orderStreams)
    pm.addPass(createPiperOrderStreams());
}

namespace {
/// Options of piper-compile-pipeline.
struct CompilePipelineOptions
    : public PassPipelineOptions<CompilePipelineOptions> {
  Option<std::string> strategy{*this, "strategy",
                               llvm::cl::desc("JSON strategy file")};
  Option<std::string> phase{
      *this, "phase",
      llvm::cl::desc("last phase: stage, training-dag, directives, devices "
                     "or streams"),
      llvm::cl::init("streams")};
};

/// The pass that fails with `message`: an invalid pipeline option is an
/// error when the pipeline runs, naming the option.
struct FailPass : PassWrapper<FailPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(FailPass)
  explicit FailPass(std::string message) : message(std::move(message)) {}
  StringRef getArgument() const override { return "piper-compile-error"; }
  void runOnOperation() override {
    getOperation().emitError(message);
    signalPassFailure();
  }
  std::string message;
};

void buildCompilePipeline(OpPassManager &pm,
                          const CompilePipelineOptions &o) {
  auto fail = [&](std::string message) {
    pm.addPass(std::make_unique<FailPass>("piper-compile-pipeline: " +
                                          std::move(message)));
  };
  ArrayRef<StringRef> phases = getCompilePhases();
  if (!llvm::is_contained(phases, StringRef(o.phase)) || o.phase == "plan")
    return fail("unknown phase '" + o.phase +
                "' (stage, training-dag, directives, devices or streams)");
  llvm::Expected<Strategy> strategy = readStrategyFile(o.strategy);
  if (!strategy)
    return fail(llvm::toString(strategy.takeError()));
  addCompilePipeline(pm, *strategy, OptimizerConfig(), o.phase);
}
} // namespace

void mlir::piper::registerPiperCompilerPasses() {
  registerPiperPasses();
  PassPipelineRegistration<CompilePipelineOptions>(
      "piper-compile-pipeline",
      "Compile a forward model with a JSON strategy, exactly as `piperc "
      "compile --strategy FILE --compile-to PHASE` does: stage, autodiff, "
      "the directives, the per-device split and the stream order",
      buildCompilePipeline);
  PassPipelineRegistration<>(
      "piper-lower-to-devices-pipeline",
      "Split a placed training DAG into device programs and fix their issue "
      "order (piper-split-devices, piper-order-streams)",
      [](OpPassManager &pm) { addLowerToDevicesPipeline(pm); });
}
