// Sequence parallelism (docs/tensor-parallel.md §5b), part of the
// `shard_tensor` rewrite (ShardTensor.h): what tensor parallelism leaves
// whole runs on each member's rows.
#include "compiler/transforms/ShardTensor.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::piper;

namespace mlir::piper::tensor_parallel {

namespace {

/// The rows of sequence parallelism over `tp` members for the selected
/// block segments (`segments`, each with its block): which values are
/// rows, the types of a member's rows and of all of them, and the errors,
/// which name the directive and the block.
struct SequenceRows {
  MLIRContext *ctx;
  SymbolTable &symbols;
  const llvm::MapVector<SegmentOp, int64_t> &segments;
  const Directive &d;
  int64_t tp;
  IntegerAttr members;

  InFlightDiagnostic fail(Operation *at, int64_t block) const {
    return at->emitOpError(d.describe())
           << ": sequence parallelism: block " << block << "'s ";
  }
  /// Whether `op` is a task calling a selected segment.
  bool selected(Operation *op) const {
    auto t = dyn_cast<TaskOp>(op);
    return t && segments.count(symbols.lookup<SegmentOp>(t.getSegment()));
  }
  /// Whether a selected task's result stays sharded: only selected tasks
  /// read it.
  bool staysSharded(Value v) const {
    return !v.use_empty() && llvm::all_of(v.getUsers(), [&](Operation *u) {
      return selected(u);
    });
  }
  /// The rows of a value that has them (a 2-D f32 tensor), or -1.
  static int64_t rowsOf(Type t) {
    auto r = dyn_cast<RankedTensorType>(t);
    return r && r.getRank() == 2 && r.getElementType().isF32() ? r.getDimSize(0)
                                                               : -1;
  }
  Type part(Type t) const {
    return withDim(t, 0, cast<RankedTensorType>(t).getDimSize(0) / tp);
  }
  Type whole(Type t) const {
    return withDim(t, 0, cast<RankedTensorType>(t).getDimSize(0) * tp);
  }
};

/// The results of tasks outside the selected blocks that only selected
/// blocks read (the embedding's output), split where they are made: what
/// the first block keeps for its backward (its input, under full
/// recomputation) and what a pipeline sends are then rows too.
llvm::DenseSet<Value> splitAtSources(ProgramOp program,
                                     const SequenceRows &rows) {
  llvm::DenseSet<Value> split;
  llvm::DenseMap<SegmentOp, int> callers;
  for (TaskOp t : program.getBody().front().getOps<TaskOp>())
    ++callers[rows.symbols.lookup<SegmentOp>(t.getSegment())];
  for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
    auto seg = rows.symbols.lookup<SegmentOp>(t.getSegment());
    if (rows.selected(t) || !seg || callers.lookup(seg) != 1)
      continue;
    Block &body = seg.getBody().front();
    auto yield = cast<YieldOp>(body.getTerminator());
    SmallVector<Type> results(seg.getFunctionType().getResults());
    bool changed = false;
    for (auto [j, out] : llvm::enumerate(t.getOuts())) {
      int64_t n = SequenceRows::rowsOf(out.getType());
      if (n < 0 || n % rows.tp != 0 || !rows.staysSharded(out))
        continue;
      OpBuilder yb(yield);
      auto sp = SpSplitOp::create(yb, yield.getLoc(), rows.part(out.getType()),
                                  yield->getOperand(j), rows.members);
      yield->setOperand(j, sp.getResult());
      out.setType(sp.getType());
      results[j] = sp.getType();
      split.insert(out);
      changed = true;
    }
    if (changed)
      seg.setFunctionTypeAttr(TypeAttr::get(
          FunctionType::get(rows.ctx, body.getArgumentTypes(), results)));
  }
  return split;
}

/// The arguments of block segment `seg` (called by `task`) on rows: those
/// a selected block or a split source passes as rows become rows, the other
/// row values are split on entry. Adds the row values to `sharded`.
LogicalResult shardArguments(SegmentOp seg, int64_t block, TaskOp task,
                             const SequenceRows &rows,
                             const llvm::DenseSet<Value> &splitAtSource,
                             llvm::DenseSet<Value> &sharded) {
  Block &body = seg.getBody().front();
  OpBuilder b(rows.ctx);
  b.setInsertionPointToStart(&body);
  for (auto [i, arg] : llvm::enumerate(body.getArguments())) {
    int64_t n = SequenceRows::rowsOf(arg.getType());
    if (n < 0)
      continue;
    if (n % rows.tp != 0)
      return rows.fail(seg, block)
             << "input " << i << " has " << n
             << " rows (microbatch size times sequence), which tensor "
                "parallelism of "
             << rows.tp << " does not divide";
    Value in = task.getArgs()[i];
    if (auto producer = in.getDefiningOp<TaskOp>();
        producer && ((rows.selected(producer) && rows.staysSharded(in)) ||
                     splitAtSource.contains(in))) {
      arg.setType(rows.part(arg.getType()));
      sharded.insert(arg);
      continue;
    }
    auto split = SpSplitOp::create(b, seg.getLoc(), rows.part(arg.getType()),
                                   arg, rows.members);
    arg.replaceAllUsesExcept(split.getResult(), split);
    sharded.insert(split.getResult());
  }
  return success();
}

/// One op of a block's body that reads rows (`sharded`): a norm, add or
/// bias runs on the rows (a whole operand is split, a parameter it reads
/// gets a partial gradient), any other op whole on the gathered rows.
LogicalResult shardRowOp(Operation &op, int64_t block, const SequenceRows &rows,
                         llvm::DenseSet<Value> &sharded,
                         llvm::DenseMap<Value, Value> &gathered) {
  OpBuilder b(&op);
  if (!isa<RmsNormOp, LayerNormOp, AddOp, BiasAddOp>(op)) {
    // Not a norm, add or bias (an MoE layer's router, dispatch and
    // experts, whose capacity and load-balancing statistics are the
    // whole microbatch's): it runs whole on every member, on the
    // gathered rows (once each), as without sequence parallelism.
    for (OpOperand &use : op.getOpOperands()) {
      Value v = use.get();
      if (!sharded.contains(v))
        continue;
      Value &all = gathered[v];
      if (!all) {
        OpBuilder gb(rows.ctx);
        gb.setInsertionPointAfterValue(v);
        all = SpGatherOp::create(gb, op.getLoc(), rows.whole(v.getType()), v,
                                 rows.members);
      }
      use.set(all);
    }
    return success();
  }
  for (OpOperand &use : op.getOpOperands()) {
    Value v = use.get();
    if (sharded.contains(v))
      continue;
    if (auto ref = v.getDefiningOp<ParamRefOp>()) {
      setSequencePartial(
          rows.symbols.lookup<ParamOp>(ref.getParamAttr().getAttr()));
      continue;
    }
    // A whole value every member computed alike (an MoE layer's output)
    // meets the rows: this member's rows of it.
    int64_t n = SequenceRows::rowsOf(v.getType());
    if (n < 0 || n % rows.tp != 0)
      return rows.fail(&op, block)
             << op.getName() << " mixes sequence-parallel rows with "
             << v.getType() << ", whose rows tensor parallelism of " << rows.tp
             << " does not divide";
    use.set(SpSplitOp::create(b, op.getLoc(), rows.part(v.getType()), v,
                              rows.members));
  }
  for (Value r : op.getResults()) {
    r.setType(rows.part(r.getType()));
    sharded.insert(r);
  }
  return success();
}

/// The body of block segment `seg` on rows: f and g become an all-gather
/// (recomputed in the backward) and a reduce-scatter of rows, the ops
/// reading rows go through shardRowOp.
LogicalResult shardBody(SegmentOp seg, int64_t block, const SequenceRows &rows,
                        llvm::DenseSet<Value> &sharded) {
  llvm::DenseMap<Value, Value> gathered;
  Block &body = seg.getBody().front();
  for (Operation &op : llvm::make_early_inc_range(body.without_terminator())) {
    OpBuilder b(&op);
    if (auto copy = dyn_cast<TpCopyOp>(op)) {
      if (!sharded.contains(copy.getInput()))
        return rows.fail(&op, block) << "column-parallel layer's input is "
                                        "not on the sequence-parallel rows";
      auto ag = SpAllGatherOp::create(b, op.getLoc(),
                                      rows.whole(copy.getInput().getType()),
                                      copy.getInput(), rows.members);
      // As Megatron does, the backward gathers the rows again for the
      // column layer's weight gradient instead of keeping them whole: the
      // all-gather is recomputed (its input, the rows, is kept).
      setRecomputeRegion(ag, block);
      copy.getResult().replaceAllUsesWith(ag.getResult());
      op.erase();
      continue;
    }
    if (auto reduce = dyn_cast<TpReduceOp>(op)) {
      auto rs = SpReduceScatterOp::create(
          b, op.getLoc(), rows.part(reduce.getInput().getType()),
          reduce.getInput(), rows.members);
      reduce.getResult().replaceAllUsesWith(rs.getResult());
      op.erase();
      sharded.insert(rs.getResult());
      continue;
    }
    if (isa<SpSplitOp>(op) || llvm::none_of(op.getOperands(), [&](Value v) {
          return sharded.contains(v);
        }))
      continue;
    if (failed(shardRowOp(op, block, rows, sharded, gathered)))
      return failure();
  }
  return success();
}

/// The results of block segment `seg` (called by `task`): rows where every
/// reader is a selected block, gathered or split where the segment's and
/// the readers' disagree; the task's and the segment's types follow.
LogicalResult shardResults(SegmentOp seg, int64_t block, TaskOp task,
                           const SequenceRows &rows,
                           const llvm::DenseSet<Value> &sharded) {
  Block &body = seg.getBody().front();
  auto yield = cast<YieldOp>(body.getTerminator());
  OpBuilder b(yield);
  SmallVector<Type> results;
  for (auto [j, v] : llvm::enumerate(yield.getValues())) {
    Value out = task.getOuts()[j];
    bool want = rows.staysSharded(out) && SequenceRows::rowsOf(v.getType()) > 0;
    bool have = sharded.contains(v);
    if (have && !want) {
      auto g = SpGatherOp::create(b, yield.getLoc(), rows.whole(v.getType()), v,
                                  rows.members);
      yield->setOperand(j, g.getResult());
    } else if (want && !have) {
      if (SequenceRows::rowsOf(v.getType()) % rows.tp != 0)
        return rows.fail(yield, block)
               << "result " << j << " has rows tensor parallelism of "
               << rows.tp << " does not divide";
      auto sp = SpSplitOp::create(b, yield.getLoc(), rows.part(v.getType()), v,
                                  rows.members);
      yield->setOperand(j, sp.getResult());
    }
    Type type = yield->getOperand(j).getType();
    out.setType(type);
    results.push_back(type);
  }
  seg.setFunctionTypeAttr(TypeAttr::get(
      FunctionType::get(rows.ctx, body.getArgumentTypes(), results)));
  return success();
}

} // namespace

LogicalResult ShardTensor::sequenceParallel(
    ProgramOp program, const llvm::MapVector<SegmentOp, int64_t> &segments) {
  MLIRContext *ctx = module.getContext();
  const SequenceRows rows{
      ctx, symbols, segments,
      d,   tp,      IntegerAttr::get(IntegerType::get(ctx, 64), tp)};
  llvm::DenseMap<Operation *, TaskOp> taskOf;
  for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
    auto seg = symbols.lookup<SegmentOp>(t.getSegment());
    if (!segments.count(seg))
      continue;
    if (taskOf.count(seg))
      return rows.fail(t, segments.lookup(seg))
             << "segment @" << seg.getSymName()
             << " is called by more than one task";
    taskOf[seg] = t;
  }
  llvm::DenseSet<Value> splitAtSource = splitAtSources(program, rows);
  for (auto [seg, block] : segments) {
    TaskOp task = taskOf.lookup(seg);
    llvm::DenseSet<Value> sharded;
    if (failed(
            shardArguments(seg, block, task, rows, splitAtSource, sharded)) ||
        failed(shardBody(seg, block, rows, sharded)) ||
        failed(shardResults(seg, block, task, rows, sharded)))
      return failure();
  }
  return success();
}

} // namespace mlir::piper::tensor_parallel
