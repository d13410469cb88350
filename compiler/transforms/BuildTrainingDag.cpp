// piper-build-training-dag: reverse-mode autodiff of every stage segment,
// the loss, and an AdamW update task per stage.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "dialects/piper/Gradients.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERBUILDTRAININGDAG
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

namespace {
/// The backward of one forward segment.
struct Differentiated {
  SegmentOp backward;
  /// Forward results that are losses (dropped from the forward's results).
  SmallVector<unsigned> lossResults;
  /// Forward results that receive a gradient argument, in B argument order.
  SmallVector<unsigned> gradResults;
  /// Residuals B reads: either a forward argument (passed straight from the
  /// program) or a value of the forward body (appended to its results).
  struct Residual {
    bool isArg;
    unsigned index; // forward argument index, or index into extraResults
  };
  SmallVector<Residual> residuals;
  SmallVector<Value> extraResults;
  /// Forward arguments that B returns a gradient for, in B result order.
  SmallVector<unsigned> gradArgs;
  /// Parameters whose gradients B accumulates.
  llvm::SetVector<StringAttr> params;
};

/// Builds the backward segment of `fwd` and rewrites `fwd` to accumulate the
/// loss and return the residuals. The gradient rules of the ops live with the
/// ops (DifferentiableOpInterface, dialects/piper/Gradients.cpp); this class
/// is the GradientEmitter they build through.
class Differentiator : public GradientEmitter {
public:
  Differentiator(SegmentOp fwd, OpBuilder &moduleBuilder, bool fuseClassifier,
                 bool fuseEpilogues)
      : fwd(fwd), mb(moduleBuilder), fuseClassifier(fuseClassifier),
        fuseEpilogues(fuseEpilogues) {}

  FailureOr<Differentiated> run() {
    Block &fb = fwd.getBody().front();
    auto yield = cast<YieldOp>(fb.getTerminator());
    // Which values depend on something trainable.
    for (BlockArgument arg : fb.getArguments())
      if (isFloat(arg))
        requiresGrad.insert(arg);
    for (Operation &op : fb.without_terminator()) {
      bool any = isa<ParamRefOp>(op);
      for (Value v : op.getOperands())
        any |= requiresGrad.contains(v);
      if (any)
        for (Value r : op.getResults())
          if (isFloat(r))
            requiresGrad.insert(r);
    }

    std::string name = fwd.getSymName().str();
    if (StringRef(name).ends_with("_F"))
      name.resize(name.size() - 2);
    bwd = SegmentOp::create(mb, fwd.getLoc(), name + "_B",
                            mb.getFunctionType({}, {}));
    Block &bb = bwd.getBody().front();
    b = std::make_unique<OpBuilder>(OpBuilder::atBlockEnd(&bb));

    for (auto [i, v] : llvm::enumerate(yield.getValues())) {
      auto t = cast<RankedTensorType>(v.getType());
      auto def = v.getDefiningOp<DifferentiableOpInterface>();
      if (t.getRank() == 0 && def && def.isLoss()) {
        out.lossResults.push_back(i);
        losses.insert(v);
      } else if (isFloat(v)) {
        out.gradResults.push_back(i);
        addGrad(*b, v, bb.addArgument(v.getType(), v.getLoc()));
      }
    }

    // Snapshot first: differentiating the loss inserts into the forward.
    SmallVector<Operation *> forwardOps;
    for (Operation &op : fb.without_terminator())
      forwardOps.push_back(&op);
    for (Operation *op : llvm::reverse(forwardOps))
      if (failed(differentiate(op)))
        return failure();
    for (Operation *op : replaced)
      op->erase();

    SmallVector<Value> results;
    for (BlockArgument arg : fb.getArguments()) {
      if (!isFloat(arg))
        continue;
      Value g = grads.lookup(arg);
      if (!g)
        return fwd.emitOpError("argument #")
               << arg.getArgNumber() << " receives no gradient";
      out.gradArgs.push_back(arg.getArgNumber());
      results.push_back(g);
    }
    YieldOp::create(*b, fwd.getLoc(), results);
    SmallVector<Type> resultTypes;
    for (Value v : results)
      resultTypes.push_back(v.getType());
    bwd.setFunctionType(mb.getFunctionType(bb.getArgumentTypes(), resultTypes));

    // Forward: drop the loss results, return the residuals.
    SmallVector<Value> fwdResults;
    for (auto [i, v] : llvm::enumerate(yield.getValues()))
      if (!llvm::is_contained(out.lossResults, i))
        fwdResults.push_back(v);
    llvm::append_range(fwdResults, out.extraResults);
    OpBuilder fbld(yield);
    YieldOp::create(fbld, yield.getLoc(), fwdResults);
    yield.erase();
    SmallVector<Type> fwdTypes;
    for (Value v : fwdResults)
      fwdTypes.push_back(v.getType());
    fwd.setFunctionType(mb.getFunctionType(fb.getArgumentTypes(), fwdTypes));
    // The recompute regions are spent: the backward re-runs their ops.
    for (Operation &op : fb.without_terminator())
      clearRecomputeRegion(&op);
    setSegmentPass(fwd, PassKind::F);
    setSegmentPass(bwd, PassKind::B);
    out.backward = bwd;
    return std::move(out);
  }

private:
  static bool isFloat(Value v) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    return t && t.getElementType().isF32();
  }

  // GradientEmitter.
  Value getGrad(Value result) override { return grads.lookup(result); }

  bool needsGrad(Value v) override { return requiresGrad.contains(v); }

  void addGrad(OpBuilder &builder, Value v, Value g) override {
    auto it = grads.find(v);
    if (it == grads.end()) {
      grads[v] = g;
      return;
    }
    it->second = AddOp::create(builder, g.getLoc(), it->second, g);
  }

  Value getSaved(OpBuilder &builder, Value v) override {
    if (Value known = mapped.lookup(v))
      return known;
    Value r;
    if (auto ref = v.getDefiningOp<ParamRefOp>()) {
      r = ParamRefOp::create(builder, ref.getLoc(), ref.getType(),
                             ref.getParamAttr());
    } else if (Operation *def = recomputed(v)) {
      // Re-run the op in the backward from its own saved operands (the
      // region's inputs, or other recomputed values), here, where the
      // first gradient rule needs it.
      IRMapping operands;
      for (Value o : def->getOperands())
        operands.map(o, getSaved(builder, o));
      Operation *clone = builder.clone(*def, operands);
      clearRecomputeRegion(clone);
      for (auto [orig, copy] :
           llvm::zip(def->getResults(), clone->getResults()))
        mapped[orig] = copy;
      return mapped.lookup(v);
    } else {
      Block &bb = bwd.getBody().front();
      r = bb.addArgument(v.getType(), v.getLoc());
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        out.residuals.push_back({true, arg.getArgNumber()});
      } else {
        out.residuals.push_back({false, unsigned(out.extraResults.size())});
        out.extraResults.push_back(v);
      }
    }
    mapped[v] = r;
    return r;
  }

  /// The op that defines `v` when the backward re-runs it instead of
  /// keeping `v`: an op of a recompute region (the `recompute` directive),
  /// unless `v` is an input of another region, which is kept (the
  /// region's checkpoint: a block's input under full recomputation).
  static Operation *recomputed(Value v) {
    Operation *def = v.getDefiningOp();
    std::optional<int64_t> region =
        def ? getRecomputeRegion(def) : std::nullopt;
    if (!region)
      return nullptr;
    for (Operation *user : v.getUsers())
      if (std::optional<int64_t> other = getRecomputeRegion(user);
          other && *other != *region)
        return nullptr;
    return def;
  }

  bool isReturnedLoss(Value loss) override { return losses.contains(loss); }

  bool fusesInForward(Value v) override {
    return fuseClassifier && !recomputed(v);
  }

  void eraseFromForward(Operation *op) override { replaced.push_back(op); }

  bool fusesEpilogues() override { return fuseEpilogues; }

  void accumulateLoss(Value loss, FloatAttr weight) override {
    OpBuilder fbld(loss.getContext());
    fbld.setInsertionPointAfterValue(loss);
    LossAccumulateOp::create(fbld, loss.getLoc(), loss, weight);
  }

  /// Runs the gradient rule of `op` (DifferentiableOpInterface), or
  /// accumulates the gradient of a parameter read.
  LogicalResult differentiate(Operation *op) {
    auto rule = dyn_cast<DifferentiableOpInterface>(op);
    // Ops none of whose results carry a gradient contribute nothing, except
    // losses, whose gradient is the loss seed.
    bool isLoss = rule && rule.isLoss();
    if (!isLoss && llvm::none_of(op->getResults(),
                                 [&](Value r) { return grads.count(r); }))
      return success();
    if (auto ref = dyn_cast<ParamRefOp>(op)) {
      AccumulateGradOp::create(*b, ref.getLoc(), ref.getParamAttr(),
                               grads.lookup(ref.getResult()));
      out.params.insert(ref.getParamAttr().getAttr());
      return success();
    }
    if (!rule)
      return op->emitError()
             << "op '" << op->getName() << "' has no gradient rule";
    // Input gradients (BI) first, then weight gradients (BW).
    if (failed(rule.emitInputGradients(*b, *this)) ||
        failed(rule.emitWeightGradients(*b, *this)))
      return failure();
    return success();
  }

  SegmentOp fwd, bwd;
  OpBuilder &mb;
  const bool fuseClassifier, fuseEpilogues;
  std::unique_ptr<OpBuilder> b;
  DenseSet<Value> requiresGrad;
  /// Scalar results the forward returns as its loss.
  DenseSet<Value> losses;
  DenseMap<Value, Value> grads;
  DenseMap<Value, Value> mapped;
  /// Forward ops a gradient rule replaced (eraseFromForward).
  SmallVector<Operation *> replaced;
  Differentiated out;
};
} // namespace

namespace {
/// A forward task of the program and the backward of its segment.
struct StageInfo {
  TaskOp fwdTask;
  SegmentOp fwdSegment;
  Differentiated diff;
  TagAttr tag;
};

/// Builds the training DAG of a program's forward tasks, one per stage:
/// differentiates their segments, then appends new forward tasks, backward
/// tasks in reverse, and an update task per stage to the program.
class TrainingDagBuilder {
public:
  TrainingDagBuilder(ModuleOp module, ProgramOp program,
                     const OptimizerConfig &opt)
      : symbols(module), mb(module.getContext()),
        pb(OpBuilder::atBlockEnd(&program.getBody().front())), opt(opt) {
    mb.setInsertionPoint(program);
  }

  /// Renames each task's segment to NAME_F and builds its backward segment
  /// NAME_B. Each segment must be called by exactly one task.
  LogicalResult differentiateStages(ArrayRef<TaskOp> tasks);
  /// Appends the new forward tasks, in order, reading each other's results
  /// without the losses.
  void createForwardTasks();
  /// Appends the backward tasks in reverse stage order, each reading the
  /// gradients of its forward results from the later stages' backward
  /// tasks.
  LogicalResult createBackwardTasks();
  /// Appends one update task per stage, unless the configuration has none.
  void createUpdateTasks();
  /// Erases the program's original forward tasks.
  void eraseOldTasks();

private:
  /// One update task for a stage, after its backward task `bwd`: AdamW on
  /// each of its parameters, then clear the accumulators for the next step.
  void createUpdateTask(StageInfo &info, TaskOp bwd);

  SymbolTable symbols;
  /// Builds segments, before the program.
  OpBuilder mb;
  /// Builds tasks, at the end of the program.
  OpBuilder pb;
  const OptimizerConfig &opt;
  std::vector<StageInfo> infos;
  SmallVector<TaskOp> newFwd, newBwd;
};
} // namespace

LogicalResult TrainingDagBuilder::differentiateStages(ArrayRef<TaskOp> tasks) {
  for (TaskOp t : tasks) {
    auto seg = symbols.lookup<SegmentOp>(t.getSegment());
    if (!seg)
      return t.emitOpError("calls unknown segment @") << t.getSegment();
    if (llvm::count_if(tasks, [&](TaskOp o) {
          return o.getSegment() == t.getSegment();
        }) != 1)
      return t.emitOpError("segment @")
             << t.getSegment() << " must be called by exactly one task";
    symbols.remove(seg);
    seg.setName(seg.getSymName().str() + "_F");
    symbols.insert(seg);
    t.setSegmentAttr(FlatSymbolRefAttr::get(seg.getSymNameAttr()));
    FailureOr<Differentiated> diff =
        Differentiator(seg, mb, opt.fuseClassifier, opt.fuseEpilogues).run();
    if (failed(diff))
      return failure();
    symbols.insert(diff->backward);
    // A parameter used by several stages (a tied LM head) gets a copy and an
    // update in each; piper-tie-params sums its gradient across them.
    infos.push_back({t, seg, std::move(*diff), t.getTag()});
  }
  return success();
}

void TrainingDagBuilder::createForwardTasks() {
  IRMapping map; // old values -> new values
  for (StageInfo &info : infos) {
    TaskOp t = info.fwdTask;
    SegmentOp seg = info.fwdSegment;
    SmallVector<Value> args;
    for (Value a : t.getArgs())
      args.push_back(map.lookupOrDefault(a));
    auto nt = TaskOp::create(pb, t.getLoc(), seg.getResultTypes(),
                             pb.getType<TokenType>(), t.getSegmentAttr(), args,
                             ValueRange(), info.tag.withPass(PassKind::F),
                             DeviceGroupAttr(), StreamAttr(), StreamAttr());
    unsigned k = 0;
    for (auto [i, r] : llvm::enumerate(t.getOuts()))
      if (!llvm::is_contained(info.diff.lossResults, i))
        map.map(r, nt.getOuts()[k++]);
    newFwd.push_back(nt);
  }
}

LogicalResult TrainingDagBuilder::createBackwardTasks() {
  // gradOf maps a new forward value to its grad.
  DenseMap<Value, Value> gradOf;
  newBwd.resize(infos.size());
  for (int64_t si = infos.size() - 1; si >= 0; --si) {
    StageInfo &info = infos[si];
    TaskOp old = info.fwdTask, nf = newFwd[si];
    SegmentOp bseg = info.diff.backward;
    SmallVector<Value> args;
    unsigned nonLoss = 0;
    SmallVector<unsigned> newIndexOfOld(old.getOuts().size(), ~0u);
    for (unsigned i = 0; i < old.getOuts().size(); ++i)
      if (!llvm::is_contained(info.diff.lossResults, i))
        newIndexOfOld[i] = nonLoss++;
    for (unsigned i : info.diff.gradResults) {
      Value v = nf.getOuts()[newIndexOfOld[i]];
      Value g = gradOf.lookup(v);
      if (!g)
        return old.emitOpError("result #")
               << i
               << " is not consumed by a later stage, so it gets no "
                  "gradient";
      args.push_back(g);
    }
    for (auto &r : info.diff.residuals)
      args.push_back(r.isArg ? nf.getArgs()[r.index]
                             : nf.getOuts()[nonLoss + r.index]);
    auto bt = TaskOp::create(pb, old.getLoc(), bseg.getResultTypes(),
                             pb.getType<TokenType>(),
                             FlatSymbolRefAttr::get(bseg.getSymNameAttr()),
                             args, ValueRange(), info.tag.withPass(PassKind::B),
                             DeviceGroupAttr(), StreamAttr(), StreamAttr());
    for (auto [k, argIndex] : llvm::enumerate(info.diff.gradArgs)) {
      Value fwdArg = nf.getArgs()[argIndex];
      if (gradOf.count(fwdArg))
        return old.emitOpError("a value feeding several stages is not "
                               "supported yet");
      gradOf[fwdArg] = bt.getOuts()[k];
    }
    newBwd[si] = bt;
  }
  return success();
}

void TrainingDagBuilder::createUpdateTask(StageInfo &info, TaskOp bwd) {
  std::string name = "stage" + std::to_string(*info.tag.getPp()) + "_U";
  auto useg = SegmentOp::create(mb, info.fwdTask.getLoc(), name,
                                mb.getFunctionType({}, {}));
  setSegmentPass(useg, PassKind::U);
  OpBuilder ub = OpBuilder::atBlockEnd(&useg.getBody().front());
  for (StringAttr p : info.diff.params) {
    auto param = symbols.lookup<ParamOp>(p);
    double wd = param.getTensorType().getRank() >= 2 ? opt.weightDecay : 0.0;
    AdamWOp::create(ub, param.getLoc(), FlatSymbolRefAttr::get(p),
                    ub.getF64FloatAttr(opt.lr), ub.getF64FloatAttr(opt.beta1),
                    ub.getF64FloatAttr(opt.beta2), ub.getF64FloatAttr(opt.eps),
                    ub.getF64FloatAttr(wd));
  }
  for (StringAttr p : info.diff.params)
    ZeroGradOp::create(ub, useg.getLoc(), FlatSymbolRefAttr::get(p));
  YieldOp::create(ub, useg.getLoc(), ValueRange());
  symbols.insert(useg);
  TaskOp::create(pb, info.fwdTask.getLoc(), TypeRange(),
                 pb.getType<TokenType>(),
                 FlatSymbolRefAttr::get(useg.getSymNameAttr()), ValueRange(),
                 ValueRange{bwd.getDone()}, info.tag.withPass(PassKind::U),
                 DeviceGroupAttr(), StreamAttr(), StreamAttr());
}

void TrainingDagBuilder::createUpdateTasks() {
  if (opt.noUpdate)
    return;
  for (auto [si, info] : llvm::enumerate(infos))
    createUpdateTask(info, newBwd[si]);
}

void TrainingDagBuilder::eraseOldTasks() {
  for (StageInfo &info : llvm::reverse(infos))
    info.fwdTask.erase();
}

LogicalResult mlir::piper::buildTrainingDag(ModuleOp module,
                                            const OptimizerConfig &opt) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  Block &body = program->getBody().front();
  SmallVector<TaskOp> tasks(body.getOps<TaskOp>());
  if (tasks.empty())
    return program->emitOpError("has no tasks to differentiate");
  for (TaskOp t : tasks) {
    if (t.getTag().getPass().has_value())
      return t.emitOpError("is already part of a training DAG");
    if (!t.getTag().getPp())
      return t.emitOpError("has no PP tag: run piper-stage first");
  }

  TrainingDagBuilder dag(module, *program, opt);
  if (failed(dag.differentiateStages(tasks)))
    return failure();
  dag.createForwardTasks();
  if (failed(dag.createBackwardTasks()))
    return failure();
  dag.createUpdateTasks();
  dag.eraseOldTasks();
  // The schedule and clipping are step-level settings the runtime applies.
  program->setOptimizerAttr(OptimizerAttr::get(module.getContext(), opt.minLr,
                                               opt.warmupSteps, opt.decaySteps,
                                               opt.clipGradNorm, opt.dtype));
  return success();
}

namespace {
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
    opt.fuseClassifier = fuseClassifier;
    opt.fuseEpilogues = fuseEpilogues;
    opt.dtype = dtype;
    if (failed(buildTrainingDag(getOperation(), opt)))
      signalPassFailure();
  }
};
} // namespace
