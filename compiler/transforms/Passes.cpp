// The piper pass pipelines (the compile pipeline piperc and piper-opt share,
// the directive phase, lower-to-devices), the compile phases, and their
// registration. Each pass lives in the file of the rewrite it runs.
#include "compiler/transforms/Passes.h"

#include "compiler/transforms/Transforms.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::piper;

namespace {
struct PhaseInfo {
  CompilePhase phase;
  StringRef name;
  StringRef what;
};
constexpr PhaseInfo kPhases[] = {
    {CompilePhase::Stage, "stage", "stage"},
    {CompilePhase::TrainingDag, "training-dag", "autodiff"},
    {CompilePhase::Directives, "directives", "applying the strategy"},
    {CompilePhase::Devices, "devices", "per-device split"},
    {CompilePhase::Streams, "streams", "stream ordering"},
    {CompilePhase::Plan, "plan", "lowering to plans"},
};

const PhaseInfo &infoOf(CompilePhase phase) {
  return kPhases[static_cast<size_t>(phase)];
}

/// The pass that fails with `message`: an invalid strategy or pipeline
/// option is an error when the pipeline runs, at the module.
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
} // namespace

StringRef mlir::piper::stringifyCompilePhase(CompilePhase phase) {
  return infoOf(phase).name;
}

std::optional<CompilePhase> mlir::piper::symbolizeCompilePhase(StringRef name) {
  for (const PhaseInfo &info : kPhases)
    if (info.name == name)
      return info.phase;
  return std::nullopt;
}

std::string mlir::piper::compilePhaseNames() {
  return llvm::join(
      llvm::map_range(kPhases, [](const PhaseInfo &i) { return i.name; }),
      ", ");
}

StringRef mlir::piper::describeCompilePhase(CompilePhase phase) {
  return infoOf(phase).what;
}

std::optional<CompilePhase>
mlir::piper::compilePhaseOfPass(StringRef argument) {
  return llvm::StringSwitch<std::optional<CompilePhase>>(argument)
      .Case("piper-stage", CompilePhase::Stage)
      .Case("piper-build-training-dag", CompilePhase::TrainingDag)
      .Cases({"piper-apply-directive", "piper-finalize-placement",
              "piper-lower-context-parallel", "piper-lower-segment-collectives",
              "piper-tie-params", "piper-bound-zero-collectives"},
             CompilePhase::Directives)
      // The directive pipeline fails this way on an invalid strategy.
      .Case("piper-compile-error", CompilePhase::Directives)
      .Case("piper-split-devices", CompilePhase::Devices)
      .Case("piper-order-streams", CompilePhase::Streams)
      .Default(std::nullopt);
}

/// Why the directive phase cannot run `strategy`, or "": at most one stage
/// and one split directive.
static std::string checkDirectiveCounts(const Strategy &strategy) {
  for (auto [kind, name] :
       {std::pair{Directive::Stage, "stage"},
        std::pair{Directive::Split, "split"},
        std::pair{Directive::ShardTensor, "shard_tensor"},
        std::pair{Directive::ContextParallel, "context_parallel"}}) {
    int seen = 0;
    for (const Directive &d : strategy.directives)
      if (d.kind() == kind && ++seen == 2)
        return d.describe() + ": only one " + name + " directive is allowed";
  }
  return "";
}

void mlir::piper::addDirectivesPipeline(OpPassManager &pm,
                                        const Strategy &strategy) {
  if (std::string err = checkDirectiveCounts(strategy); !err.empty())
    return pm.addPass(std::make_unique<FailPass>(std::move(err)));
  std::optional<int64_t> world = strategy.worldSize;
  auto addAll = [&](Directive::Kind kind) {
    for (const Directive &d : strategy.directives)
      if (d.kind() == kind)
        pm.addPass(createApplyDirectivePass(d, world));
  };
  if (llvm::none_of(strategy.directives, [](const Directive &d) {
        return d.kind() == Directive::Split;
      })) {
    Directive one(SplitOptions{1}, "implicit split num_microbatches=1");
    pm.addPass(createApplyDirectivePass(one, world));
  }
  addAll(Directive::Split);
  addAll(Directive::Place);
  pm.addPass(createPiperFinalizePlacement(
      PiperFinalizePlacementOptions{world.value_or(0)}));
  // shard before replicate: it makes expert weights local, and replicate
  // reduces their gradients over the ranks holding the same experts.
  addAll(Directive::Shard);
  // The context-parallel rings, then every in-segment collective (tp, cp,
  // ep) a node over the placed devices; replicate then reduces gradients
  // over the data-parallel replicas of each member.
  pm.addPass(createPiperLowerContextParallel());
  pm.addPass(createPiperLowerSegmentCollectives());
  addAll(Directive::Replicate);
  // The tie all-reduces span the groups of several replicates: buckets of
  // the smallest of their sizes.
  double tieBucketMb = kDefaultBucketMb;
  bool replicated = false;
  for (const Directive &d : strategy.directives)
    if (d.kind() == Directive::Replicate) {
      double mb = d.get<ReplicateOptions>().bucketMb;
      tieBucketMb = replicated ? std::min(tieBucketMb, mb) : mb;
      replicated = true;
    }
  pm.addPass(createPiperTieParams(PiperTieParamsOptions{tieBucketMb}));
  // The order directives in one pass: one sort of the program after them
  // all, not one each.
  std::vector<Directive> orders;
  for (const Directive &d : strategy.directives)
    if (d.kind() == Directive::Order)
      orders.push_back(d);
  if (!orders.empty())
    pm.addPass(createApplyOrderDirectivesPass(std::move(orders)));
  addAll(Directive::Schedule);
  pm.addPass(createPiperBoundZeroCollectives());
}

void mlir::piper::addCompilePipeline(OpPassManager &pm,
                                     const Strategy &strategy,
                                     const OptimizerConfig &opt,
                                     CompilePhase lastPhase) {
  if (std::string err = checkDirectiveCounts(strategy); !err.empty())
    return pm.addPass(std::make_unique<FailPass>(std::move(err)));
  auto wants = [&](CompilePhase phase) { return phase <= lastPhase; };
  if (wants(CompilePhase::Stage)) {
    // shard_tensor splits the forward model's blocks, context_parallel
    // their sequences, and recompute marks them (the f and g of tensor
    // parallelism too), before stage merges them.
    for (Directive::Kind kind :
         {Directive::ShardTensor, Directive::ContextParallel,
          Directive::Recompute})
      for (const Directive &d : strategy.directives)
        if (d.kind() == kind)
          pm.addPass(createApplyDirectivePass(d, strategy.worldSize));
    pm.addPass(createPiperStage(PiperStageOptions{numStages(strategy)}));
  }
  if (wants(CompilePhase::TrainingDag)) {
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
    o.fuseClassifier = opt.fuseClassifier;
    o.fuseEpilogues = opt.fuseEpilogues;
    pm.addPass(createPiperBuildTrainingDag(o));
  }
  if (wants(CompilePhase::Directives))
    addDirectivesPipeline(pm, strategy);
  if (wants(CompilePhase::Devices))
    addLowerToDevicesPipeline(pm,
                              /*orderStreams=*/wants(CompilePhase::Streams));
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

/// Options of piper-directives-pipeline.
struct DirectivesPipelineOptions
    : public PassPipelineOptions<DirectivesPipelineOptions> {
  Option<std::string> strategy{*this, "strategy",
                               llvm::cl::desc("JSON strategy file")};
  Option<int64_t> worldSize{
      *this, "world-size",
      llvm::cl::desc("number of devices (0: the file's world_size)"),
      llvm::cl::init(0)};
};

/// The strategy file of a pipeline option, or a pass that fails naming the
/// pipeline and the error.
std::optional<Strategy> readPipelineStrategy(OpPassManager &pm,
                                             StringRef pipeline,
                                             const std::string &file) {
  llvm::Expected<Strategy> strategy = readStrategyFile(file);
  if (strategy)
    return std::move(*strategy);
  pm.addPass(std::make_unique<FailPass>(
      (pipeline + ": " + llvm::toString(strategy.takeError())).str()));
  return std::nullopt;
}

void buildCompilePipeline(OpPassManager &pm, const CompilePipelineOptions &o) {
  std::optional<CompilePhase> phase = symbolizeCompilePhase(o.phase);
  if (!phase || *phase == CompilePhase::Plan)
    return pm.addPass(std::make_unique<FailPass>(
        "piper-compile-pipeline: unknown phase '" + o.phase +
        "' (stage, training-dag, directives, devices or streams)"));
  if (std::optional<Strategy> strategy =
          readPipelineStrategy(pm, "piper-compile-pipeline", o.strategy))
    addCompilePipeline(pm, *strategy, OptimizerConfig(), *phase);
}

void buildDirectivesPipeline(OpPassManager &pm,
                             const DirectivesPipelineOptions &o) {
  std::optional<Strategy> strategy =
      readPipelineStrategy(pm, "piper-directives-pipeline", o.strategy);
  if (!strategy)
    return;
  for (const Directive &d : strategy->directives)
    if (d.kind() == Directive::Recompute ||
        d.kind() == Directive::ShardTensor ||
        d.kind() == Directive::ContextParallel)
      return pm.addPass(std::make_unique<FailPass>(
          "piper-directives-pipeline: " + d.describe() + ": " +
          d.kindName().str() +
          " rewrites the forward model before autodiff; run it "
          "with piper-compile-pipeline (or piper-apply-directive before "
          "piper-stage)"));
  if (o.worldSize > 0)
    strategy->worldSize = o.worldSize;
  addDirectivesPipeline(pm, *strategy);
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
  PassPipelineRegistration<DirectivesPipelineOptions>(
      "piper-directives-pipeline",
      "The directive phase of a JSON strategy on a training DAG (after "
      "piper-stage and piper-build-training-dag): one piper-apply-directive "
      "per directive in phase order, with piper-finalize-placement, "
      "piper-tie-params and piper-bound-zero-collectives between",
      buildDirectivesPipeline);
  PassPipelineRegistration<>(
      "piper-lower-to-devices-pipeline",
      "Split a placed training DAG into device programs and fix their issue "
      "order (piper-split-devices, piper-order-streams)",
      [](OpPassManager &pm) { addLowerToDevicesPipeline(pm); });
}
