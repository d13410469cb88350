// Sequence parallelism (docs/tensor-parallel.md §5b), part of the
// `shard_tensor` rewrite (ShardTensor.h): what tensor parallelism leaves
// whole runs on each member's rows.
#include "compiler/transforms/ShardTensor.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::piper;

namespace mlir::piper::tensor_parallel {

/// Sequence parallelism over the selected blocks (Megatron's): f and g
/// become an all-gather and a reduce-scatter of rows, and what lies
/// outside them (norms, residual adds, row biases) runs on each member's
/// N / T rows. A block result every reader of which is a selected block
/// stays sharded; others are gathered (`sp_gather`), and whole values
/// entering a block are split (`sp_split`). Parameters read on rows
/// (norm weights, row biases) get partial gradients: replicate sums them
/// over the tensor-parallel group too (`piper.sequence_partial`). Any
/// other op reading rows (an MoE layer's router, dispatch and experts)
/// runs whole on every member on the gathered rows (`sp_gather`), and a
/// whole value meeting rows again is split (`sp_split`).
LogicalResult ShardTensor::sequenceParallel(
    ProgramOp program, const llvm::MapVector<SegmentOp, int64_t> &segments) {
  MLIRContext *ctx = module.getContext();
  IntegerAttr members = IntegerAttr::get(IntegerType::get(ctx, 64), tp);
  auto fail = [&](Operation *at, int64_t block) {
    return at->emitOpError(d.describe())
           << ": sequence parallelism: block " << block << "'s ";
  };
  llvm::DenseMap<Operation *, TaskOp> taskOf;
  for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
    auto seg = symbols.lookup<SegmentOp>(t.getSegment());
    if (!segments.count(seg))
      continue;
    if (taskOf.count(seg))
      return fail(t, segments.lookup(seg))
             << "segment @" << seg.getSymName()
             << " is called by more than one task";
    taskOf[seg] = t;
  }
  auto selected = [&](Operation *op) {
    auto t = dyn_cast<TaskOp>(op);
    return t && segments.count(symbols.lookup<SegmentOp>(t.getSegment()));
  };
  // A selected task's result stays sharded when only selected tasks
  // read it.
  auto staysSharded = [&](Value v) {
    return !v.use_empty() && llvm::all_of(v.getUsers(), selected);
  };
  auto rowsOf = [](Type t) -> int64_t {
    auto r = dyn_cast<RankedTensorType>(t);
    return r && r.getRank() == 2 && r.getElementType().isF32() ? r.getDimSize(0)
                                                               : -1;
  };
  auto part = [&](Type t) {
    return withDim(t, 0, cast<RankedTensorType>(t).getDimSize(0) / tp);
  };
  auto whole = [&](Type t) {
    return withDim(t, 0, cast<RankedTensorType>(t).getDimSize(0) * tp);
  };
  // A result of a task outside the selected blocks that only selected
  // blocks read (the embedding's output) is split where it is made: what
  // the first block keeps for its backward (its input, under full
  // recomputation) and what a pipeline sends are then rows too.
  llvm::DenseSet<Value> splitAtSource;
  llvm::DenseMap<SegmentOp, int> callers;
  for (TaskOp t : program.getBody().front().getOps<TaskOp>())
    ++callers[symbols.lookup<SegmentOp>(t.getSegment())];
  for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
    auto seg = symbols.lookup<SegmentOp>(t.getSegment());
    if (selected(t) || !seg || callers.lookup(seg) != 1)
      continue;
    Block &body = seg.getBody().front();
    auto yield = cast<YieldOp>(body.getTerminator());
    SmallVector<Type> results(seg.getFunctionType().getResults());
    bool changed = false;
    for (auto [j, out] : llvm::enumerate(t.getOuts())) {
      int64_t rows = rowsOf(out.getType());
      if (rows < 0 || rows % tp != 0 || !staysSharded(out))
        continue;
      OpBuilder yb(yield);
      auto split = SpSplitOp::create(yb, yield.getLoc(), part(out.getType()),
                                     yield->getOperand(j), members);
      yield->setOperand(j, split.getResult());
      out.setType(split.getType());
      results[j] = split.getType();
      splitAtSource.insert(out);
      changed = true;
    }
    if (changed)
      seg.setFunctionTypeAttr(TypeAttr::get(
          FunctionType::get(ctx, body.getArgumentTypes(), results)));
  }
  for (auto [seg, block] : segments) {
    TaskOp task = taskOf.lookup(seg);
    Block &body = seg.getBody().front();
    llvm::DenseSet<Value> sharded;
    OpBuilder b(ctx);
    b.setInsertionPointToStart(&body);
    for (auto [i, arg] : llvm::enumerate(body.getArguments())) {
      int64_t rows = rowsOf(arg.getType());
      if (rows < 0)
        continue;
      if (rows % tp != 0)
        return fail(seg, block)
               << "input " << i << " has " << rows
               << " rows (microbatch size times sequence), which tensor "
                  "parallelism of "
               << tp << " does not divide";
      Value in = task.getArgs()[i];
      if (auto producer = in.getDefiningOp<TaskOp>();
          producer && ((selected(producer) && staysSharded(in)) ||
                       splitAtSource.contains(in))) {
        arg.setType(part(arg.getType()));
        sharded.insert(arg);
        continue;
      }
      auto split =
          SpSplitOp::create(b, seg.getLoc(), part(arg.getType()), arg, members);
      arg.replaceAllUsesExcept(split.getResult(), split);
      sharded.insert(split.getResult());
    }
    // Sharded values gathered for ops that need every row, once each.
    llvm::DenseMap<Value, Value> gathered;
    for (Operation &op :
         llvm::make_early_inc_range(body.without_terminator())) {
      b.setInsertionPoint(&op);
      if (auto copy = dyn_cast<TpCopyOp>(op)) {
        if (!sharded.contains(copy.getInput()))
          return fail(&op, block) << "column-parallel layer's input is "
                                     "not on the sequence-parallel rows";
        auto ag = SpAllGatherOp::create(b, op.getLoc(),
                                        whole(copy.getInput().getType()),
                                        copy.getInput(), members);
        // As Megatron does, the backward gathers the rows again for the
        // column layer's weight gradient instead of keeping them whole:
        // the all-gather is recomputed (its input, the rows, is kept).
        setRecomputeRegion(ag, block);
        copy.getResult().replaceAllUsesWith(ag.getResult());
        op.erase();
        continue;
      }
      if (auto reduce = dyn_cast<TpReduceOp>(op)) {
        auto rs = SpReduceScatterOp::create(b, op.getLoc(),
                                            part(reduce.getInput().getType()),
                                            reduce.getInput(), members);
        reduce.getResult().replaceAllUsesWith(rs.getResult());
        op.erase();
        sharded.insert(rs.getResult());
        continue;
      }
      if (isa<SpSplitOp>(op))
        continue;
      bool reads = llvm::any_of(op.getOperands(),
                                [&](Value v) { return sharded.contains(v); });
      if (!reads)
        continue;
      if (!isa<RmsNormOp, LayerNormOp, AddOp, BiasAddOp>(op)) {
        // Not a norm, add or bias (an MoE layer's router, dispatch and
        // experts, whose capacity and load-balancing statistics are the
        // whole microbatch's): it runs whole on every member, on the
        // gathered rows, as without sequence parallelism.
        for (OpOperand &use : op.getOpOperands()) {
          Value v = use.get();
          if (!sharded.contains(v))
            continue;
          Value &all = gathered[v];
          if (!all) {
            OpBuilder gb(ctx);
            gb.setInsertionPointAfterValue(v);
            all = SpGatherOp::create(gb, op.getLoc(), whole(v.getType()), v,
                                     members);
          }
          use.set(all);
        }
        continue;
      }
      for (OpOperand &use : op.getOpOperands()) {
        Value v = use.get();
        if (sharded.contains(v))
          continue;
        if (auto ref = v.getDefiningOp<ParamRefOp>()) {
          setSequencePartial(
              symbols.lookup<ParamOp>(ref.getParamAttr().getAttr()));
          continue;
        }
        // A whole value every member computed alike (an MoE layer's
        // output) meets the rows: this member's rows of it.
        int64_t rows = rowsOf(v.getType());
        if (rows < 0 || rows % tp != 0)
          return fail(&op, block)
                 << op.getName() << " mixes sequence-parallel rows with "
                 << v.getType() << ", whose rows tensor parallelism of " << tp
                 << " does not divide";
        use.set(
            SpSplitOp::create(b, op.getLoc(), part(v.getType()), v, members));
      }
      for (Value r : op.getResults()) {
        r.setType(part(r.getType()));
        sharded.insert(r);
      }
    }
    auto yield = cast<YieldOp>(body.getTerminator());
    b.setInsertionPoint(yield);
    SmallVector<Type> results;
    for (auto [j, v] : llvm::enumerate(yield.getValues())) {
      Value out = task.getOuts()[j];
      bool want = staysSharded(out) && rowsOf(v.getType()) > 0;
      bool have = sharded.contains(v);
      if (have && !want) {
        auto g = SpGatherOp::create(b, yield.getLoc(), whole(v.getType()), v,
                                    members);
        yield->setOperand(j, g.getResult());
      } else if (want && !have) {
        if (rowsOf(v.getType()) % tp != 0)
          return fail(yield, block)
                 << "result " << j << " has rows tensor parallelism of " << tp
                 << " does not divide";
        auto sp =
            SpSplitOp::create(b, yield.getLoc(), part(v.getType()), v, members);
        yield->setOperand(j, sp.getResult());
      }
      Type type = yield->getOperand(j).getType();
      out.setType(type);
      results.push_back(type);
    }
    seg.setFunctionTypeAttr(TypeAttr::get(
        FunctionType::get(ctx, body.getArgumentTypes(), results)));
  }
  return success();
}

} // namespace mlir::piper::tensor_parallel
