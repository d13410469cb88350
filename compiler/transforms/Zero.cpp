// ZeRO, the sharded form of `replicate` (docs/zero.md): the AdamW moments
// (ZeRO-1), the gradient accumulators (ZeRO-2) and the parameters (ZeRO-3)
// of a replicated stage are split over its data-parallel replicas, and the
// collectives that move them are explicit nodes of the program.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERBOUNDZEROCOLLECTIVES
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

SmallVector<SmallVector<Attribute>>
mlir::piper::bucketParams(SymbolTable &symbols, ArrayRef<StringAttr> params,
                          double bucketSizeMb) {
  SmallVector<SmallVector<Attribute>> buckets(1);
  double bytes = 0, limit = bucketSizeMb * 1024 * 1024;
  llvm::SmallDenseSet<StringAttr> inBucket;
  for (StringAttr p : params) {
    auto param = symbols.lookup<ParamOp>(p);
    double size = 4.0 * param.getTensorType().getNumElements();
    // A parameter appears once per collective (a segment may accumulate a
    // parameter it reads twice, e.g. a tied embedding, twice).
    if (!buckets.back().empty() &&
        (bytes + size > limit || inBucket.contains(p))) {
      buckets.emplace_back();
      inBucket.clear();
      bytes = 0;
    }
    buckets.back().push_back(FlatSymbolRefAttr::get(p));
    inBucket.insert(p);
    bytes += size;
  }
  if (buckets.back().empty())
    buckets.pop_back();
  return buckets;
}

namespace {

/// The accumulate_grad ops of the sharded parameters in `seg` become
/// results: the gradient of one microbatch leaves the segment whole, and a
/// reduce-scatter adds each member's range into its sharded accumulator.
/// Returns the parameters of the new results, in order.
SmallVector<StringAttr>
yieldGradients(SegmentOp seg, const llvm::SetVector<StringAttr> &zero) {
  Block &body = seg.getBody().front();
  auto yield = cast<YieldOp>(body.getTerminator());
  SmallVector<StringAttr> params;
  SmallVector<Value> grads;
  for (auto acc : llvm::make_early_inc_range(body.getOps<AccumulateGradOp>())) {
    StringAttr p = acc.getParamAttr().getAttr();
    if (!zero.contains(p))
      continue;
    params.push_back(p);
    grads.push_back(acc.getGrad());
    acc.erase();
  }
  if (params.empty())
    return params;
  yield->insertOperands(yield->getNumOperands(), grads);
  SmallVector<Type> results(seg.getResultTypes());
  for (Value g : grads)
    results.push_back(g.getType());
  seg.setFunctionTypeAttr(TypeAttr::get(
      FunctionType::get(seg.getContext(), seg.getArgumentTypes(), results)));
  return params;
}

/// Where to cut a backward segment so that each piece accumulates about
/// `bucketSizeMb` of the sharded parameters' gradients: after the
/// accumulate_grad that fills a bucket, or, when a weight gradient computed
/// before that point is still to be read after it (the other output of a
/// layer_norm_grad_weight, an embedding's gradient computed before the
/// position embedding's is accumulated), at the first point after it where
/// none is. What crosses a cut is then only the input-gradient chain (BI
/// values, in splitBackwardTasks' terms): a piece never hands a weight
/// gradient to the next. Otherwise, once an `order` splits the pieces into
/// BI and BW, the next piece's BI (which takes the arguments and passes
/// them through) would read this piece's BW, and a zero-bubble order that
/// runs a microbatch's BIs before its BWs would be a cycle.
SmallVector<unsigned> gradientCuts(SegmentOp seg,
                                   const llvm::SetVector<StringAttr> &zero,
                                   SymbolTable &symbols, double bucketSizeMb) {
  SmallVector<unsigned> cuts;
  double bytes = 0, limit = bucketSizeMb * 1024 * 1024;
  Block &body = seg.getBody().front();
  DenseMap<Operation *, unsigned> half = weightGradientOps(seg);
  DenseMap<Operation *, unsigned> position;
  for (auto [i, op] : llvm::enumerate(body.without_terminator()))
    position[&op] = i;
  unsigned numOps = position.size();
  // The last op (by position) that reads a weight gradient computed so far;
  // a cut before op c is safe when it is before c.
  std::optional<unsigned> weightReadUntil;
  bool full = false;
  for (auto [i, op] : llvm::enumerate(body.without_terminator())) {
    if (half.lookup(&op) == 1)
      for (Operation *user : op.getUsers()) {
        Operation *top = body.findAncestorOpInBlock(*user);
        auto it = top ? position.find(top) : position.end();
        if (it != position.end() &&
            (!weightReadUntil || it->second > *weightReadUntil))
          weightReadUntil = it->second;
      }
    if (auto acc = dyn_cast<AccumulateGradOp>(op);
        acc && zero.contains(acc.getParamAttr().getAttr())) {
      auto param = symbols.lookup<ParamOp>(acc.getParamAttr().getAttr());
      bytes += 4.0 * param.getTensorType().getNumElements();
      full |= bytes >= limit;
    }
    // A cut before op i + 1.
    bool weightsDone = !weightReadUntil || *weightReadUntil <= i;
    if (full && i + 1 < numOps && weightsDone) {
      cuts.push_back(i + 1);
      bytes = 0;
      full = false;
    }
  }
  return cuts;
}

/// Where to cut a segment so that each piece reads about `bucketSizeMb` of
/// the sharded parameters (ZeRO-3 gathers them per piece): before the
/// parameter read that would overfill the piece.
SmallVector<unsigned> paramCuts(SegmentOp seg,
                                const llvm::SetVector<StringAttr> &zero,
                                SymbolTable &symbols, double bucketSizeMb) {
  SmallVector<unsigned> cuts;
  double bytes = 0, limit = bucketSizeMb * 1024 * 1024;
  llvm::SmallDenseSet<StringAttr> inPiece;
  unsigned i = 0;
  for (Operation &op : seg.getBody().front().without_terminator()) {
    auto ref = dyn_cast<ParamRefOp>(op);
    if (ref && zero.contains(ref.getParamAttr().getAttr()) &&
        !inPiece.contains(ref.getParamAttr().getAttr())) {
      auto param = symbols.lookup<ParamOp>(ref.getParamAttr().getAttr());
      double size = 4.0 * param.getTensorType().getNumElements();
      if (!inPiece.empty() && bytes + size > limit) {
        cuts.push_back(i);
        inPiece.clear();
        bytes = 0;
      }
      inPiece.insert(ref.getParamAttr().getAttr());
      bytes += size;
    }
    ++i;
  }
  return cuts;
}

/// ZeRO-3: the reads of sharded parameters in `seg` become new arguments
/// (the gathered whole parameters). Returns the parameters of the new
/// arguments, in order.
SmallVector<StringAttr> liftParams(SegmentOp seg,
                                   const llvm::SetVector<StringAttr> &zero) {
  Block &body = seg.getBody().front();
  llvm::MapVector<StringAttr, BlockArgument> args;
  for (auto ref : llvm::make_early_inc_range(body.getOps<ParamRefOp>())) {
    StringAttr p = ref.getParamAttr().getAttr();
    if (!zero.contains(p))
      continue;
    auto it = args.find(p);
    if (it == args.end())
      it =
          args.insert({p, body.addArgument(ref.getType(), ref.getLoc())}).first;
    ref.getResult().replaceAllUsesWith(it->second);
    ref.erase();
  }
  SmallVector<StringAttr> params;
  if (args.empty())
    return params;
  for (auto &entry : args)
    params.push_back(entry.first);
  seg.setFunctionTypeAttr(TypeAttr::get(FunctionType::get(
      seg.getContext(), body.getArgumentTypes(), seg.getResultTypes())));
  return params;
}

} // namespace

LogicalResult mlir::piper::applyZero(ModuleOp module, ProgramOp program,
                                     const Directive &d,
                                     const llvm::SetVector<StringAttr> &params,
                                     ArrayRef<TaskOp> backward,
                                     TagAttr stageTag, ArrayAttr subgroups) {
  const auto &o = d.get<ReplicateOptions>();
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  SymbolTable symbols(module);
  auto group = DeviceGroupAttr::get(ctx, o.devices);
  StreamAttr reduceStream = commStream(program, o.reduceStream);
  StreamAttr gatherStream = commStream(program, o.gatherStream);
  IntegerAttr stage = b.getI64IntegerAttr(o.zero);
  SmallVector<Value> reduced, gathered;

  if (o.zero == 1) {
    // ZeRO-1: gradients accumulate whole over the microbatches, as without
    // ZeRO; one reduce-scatter per bucket after the last backward leaves
    // each member the range it updates.
    SmallVector<Value> deps;
    for (TaskOp t : backward)
      deps.push_back(t.getDone());
    TaskOp last = backward.back();
    b.setInsertionPointAfter(last);
    for (auto &bucket :
         bucketParams(symbols, params.getArrayRef(), o.bucketMb)) {
      auto rs = ReduceScatterGradsOp::create(
          b, last.getLoc(), b.getType<TokenType>(), ValueRange(),
          b.getArrayAttr(bucket), stage, deps, group, reduceStream, stageTag,
          IntegerAttr(), subgroups);
      reduced.push_back(rs.getDone());
    }
  } else {
    // ZeRO-2 and 3: no whole accumulator. Each backward segment is cut
    // into pieces of about a bucket of gradients; each piece hands its
    // gradients on, and a reduce-scatter per piece task (per microbatch)
    // adds each member's range into its sharded accumulator. Only the
    // gradients of the pieces in flight exist whole. ZeRO-3 also cuts the
    // forward segments into pieces of about a bucket of parameters, and
    // every piece task reads the whole parameters it needs from an
    // all-gather of their shards, freed after it.
    SmallVector<TaskOp> tasks(backward.begin(), backward.end());
    if (o.zero == 3)
      for (TaskOp t : program.getBody().front().getOps<TaskOp>())
        if (t.getTag().isPass(PassKind::F) && t.getDevicesAttr() == group)
          tasks.push_back(t);
    llvm::MapVector<StringAttr, SegmentPieces> piecesOf;
    for (TaskOp t : tasks) {
      StringAttr name = t.getSegmentAttr().getAttr();
      if (piecesOf.count(name))
        continue;
      auto seg = symbols.lookup<SegmentOp>(name);
      bool isBackward = t.getTag().isPass(PassKind::B);
      FailureOr<SegmentPieces> pieces = splitSegment(
          seg, isBackward ? gradientCuts(seg, params, symbols, o.bucketMb)
                          : paramCuts(seg, params, symbols, o.bucketMb));
      if (failed(pieces))
        return failure();
      for (SegmentOp piece : pieces->pieces)
        symbols.insert(piece);
      piecesOf[name] = std::move(*pieces);
    }
    // Each piece's gradients become results, and (ZeRO-3) its parameter
    // reads arguments.
    llvm::DenseMap<StringAttr, SmallVector<StringAttr>> yielded, lifted;
    for (auto &entry : piecesOf)
      for (SegmentOp piece : entry.second.pieces) {
        yielded[piece.getSymNameAttr()] = yieldGradients(piece, params);
        if (o.zero == 3)
          lifted[piece.getSymNameAttr()] = liftParams(piece, params);
      }
    for (TaskOp old : tasks) {
      const SegmentPieces &pieces = piecesOf[old.getSegmentAttr().getAttr()];
      for (TaskOp t : splitTask(old, pieces)) {
        StringAttr name = t.getSegmentAttr().getAttr();
        if (ArrayRef<StringAttr> reads = lifted[name]; !reads.empty()) {
          b.setInsertionPoint(t);
          SmallVector<Attribute> refs;
          SmallVector<Type> types;
          for (StringAttr p : reads) {
            refs.push_back(FlatSymbolRefAttr::get(p));
            types.push_back(symbols.lookup<ParamOp>(p).getType());
          }
          // Its dependencies (the prefetch distance) are set once the
          // schedule is known: boundZeroCollectives.
          auto ag = AllGatherParamsOp::create(
              b, t.getLoc(), types, b.getType<TokenType>(),
              b.getArrayAttr(refs), stage, ValueRange(), group, gatherStream,
              t.getTag(), IntegerAttr(), subgroups);
          t.getArgsMutable().append(ag.getResults());
          gathered.push_back(ag.getDone());
        }
        ArrayRef<StringAttr> gradParams = yielded[name];
        if (gradParams.empty())
          continue;
        unsigned next = t.getOuts().size() - gradParams.size();
        b.setInsertionPointAfter(t);
        for (auto &bucket : bucketParams(symbols, gradParams, o.bucketMb)) {
          SmallVector<Value> grads;
          for (size_t i = 0; i < bucket.size(); ++i)
            grads.push_back(t.getOuts()[next++]);
          auto rs = ReduceScatterGradsOp::create(
              b, t.getLoc(), b.getType<TokenType>(), grads,
              b.getArrayAttr(bucket), stage, ValueRange{t.getDone()}, group,
              reduceStream, t.getTag(), IntegerAttr(), subgroups);
          reduced.push_back(rs.getDone());
        }
      }
    }
    // The split segments, unless another group's tasks still call them
    // (DualPipe's other copy, which that copy's replicate splits).
    eraseUncalledSegments(program, symbols, piecesOf);
  }

  // Every update of a sharded parameter waits for its reductions; after
  // it, ZeRO-1 and 2 gather the updated ranges back into whole parameters.
  SegmentParams segmentParams(module);
  for (TaskOp u :
       llvm::make_early_inc_range(program.getBody().front().getOps<TaskOp>())) {
    // Another group's update of a parameter with copies there (DualPipe's
    // other copy) is that group's replicate's.
    if (!u.getTag().isPass(PassKind::U) || u.getDevicesAttr() != group)
      continue;
    SmallVector<StringAttr> updated;
    for (StringAttr p : segmentParams.updated(u.getSegment()))
      if (params.contains(p))
        updated.push_back(p);
    if (updated.empty())
      continue;
    u.getDepsMutable().append(reduced);
    if (o.zero == 3) {
      // The update writes the shards every gather of the step reads.
      u.getDepsMutable().append(gathered);
      continue;
    }
    b.setInsertionPointAfter(u);
    for (auto &bucket : bucketParams(symbols, updated, o.bucketMb))
      AllGatherParamsOp::create(
          b, u.getLoc(), TypeRange(), b.getType<TokenType>(),
          b.getArrayAttr(bucket), stage, ValueRange{u.getDone()}, group,
          gatherStream, stageTag, IntegerAttr(), subgroups);
  }
  return sortTopologically(program.getBody().front());
}

LogicalResult mlir::piper::boundZeroCollectives(ModuleOp module) {
  // Block order is the schedule's (the order directives have run) and a
  // topological one, so the edges below add no cycle.
  for (ProgramOp program : module.getOps<ProgramOp>()) {
    Block &block = program.getBody().front();
    using Key = std::pair<Attribute, Attribute>; // (devices, stream)
    // The gradients a backward piece hands to its reduce-scatters live until
    // those finish; nothing else stops later pieces from running ahead of
    // the communication, holding every microbatch's gradients at once. So
    // piece task i + 2 of a device group waits for the reduce-scatters of
    // piece task i: one piece reducing while the next computes.
    llvm::MapVector<Key, SmallVector<TaskOp>> reducing;
    llvm::DenseMap<Operation *, SmallVector<Value>> reductionsOf;
    for (auto rs : block.getOps<ReduceScatterGradsOp>()) {
      if (rs.getInputs().empty())
        continue;
      auto t = rs.getInputs().front().getDefiningOp<TaskOp>();
      if (!t)
        continue;
      auto &list = reductionsOf[t];
      if (list.empty())
        reducing[{t.getDevicesAttr(), t.getNodeStream()}].push_back(t);
      list.push_back(rs.getDone());
    }
    for (auto &entry : reducing) {
      SmallVector<TaskOp> &tasks = entry.second;
      llvm::sort(tasks,
                 [](TaskOp a, TaskOp b) { return a->isBeforeInBlock(b); });
      for (size_t i = 2; i < tasks.size(); ++i)
        tasks[i].getDepsMutable().append(reductionsOf[tasks[i - 2]]);
    }
    // ZeRO-3: the gather of task i's parameters starts when task i - 2 of
    // its device group and stream is done: it overlaps task i - 1 (a
    // prefetch of one piece), and at most two pieces' parameters are whole
    // at a time.
    llvm::MapVector<Key, SmallVector<TaskOp>> order;
    for (TaskOp t : block.getOps<TaskOp>())
      order[{t.getDevicesAttr(), t.getNodeStream()}].push_back(t);
    llvm::DenseMap<Operation *, size_t> position;
    for (auto &entry : order)
      for (auto [i, t] : llvm::enumerate(entry.second))
        position[t] = i;
    for (auto ag : block.getOps<AllGatherParamsOp>()) {
      if (ag.getResults().empty() || ag.getResults().front().use_empty())
        continue;
      // The first task (in schedule order) that reads the gathered
      // parameters: a split backward's BI and BW both do.
      TaskOp t;
      for (Operation *user : ag.getResults().front().getUsers())
        if (auto task = dyn_cast<TaskOp>(user);
            task && (!t || task->isBeforeInBlock(t)))
          t = task;
      if (!t)
        continue;
      size_t i = position.lookup(t);
      if (i >= 2)
        ag.getDepsMutable().append(
            order[{t.getDevicesAttr(), t.getNodeStream()}][i - 2].getDone());
    }
    if (failed(sortTopologically(block)))
      return failure();
  }
  return success();
}

namespace {
struct BoundZeroCollectivesPass
    : mlir::piper::impl::PiperBoundZeroCollectivesBase<
          BoundZeroCollectivesPass> {
  void runOnOperation() override {
    if (failed(boundZeroCollectives(getOperation())))
      signalPassFailure();
  }
};
} // namespace
