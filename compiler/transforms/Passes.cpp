// The piper pass pipelines (the compile pipeline piperc and piper-opt share,
// lower-to-devices) and their registration. Each pass lives in the file of
// the rewrite it runs.
#include "compiler/transforms/Passes.h"

#include "compiler/transforms/Transforms.h"

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

void mlir::piper::registerPiperCompilerPasses() {
  registerPiperPasses();
  PassPipelineRegistration<>(
      "piper-lower-to-devices-pipeline",
      "Split a placed training DAG into device programs and fix their issue "
      "order (piper-split-devices, piper-order-streams)",
      [](OpPassManager &pm) { addLowerToDevicesPipeline(pm); });
}
