// ZeRO, the sharded form of `replicate` (docs/zero.md): the AdamW moments
// (ZeRO-1), the gradient accumulators (ZeRO-2) and the parameters (ZeRO-3)
// of a replicated stage are split over its data-parallel replicas, and the
// collectives that move them are explicit nodes of the program.
#include "compiler/transforms/Transforms.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "mlir/IR/Builders.h"

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
SmallVector<StringAttr> yieldGradients(SegmentOp seg,
                                       const llvm::SetVector<StringAttr> &zero) {
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
/// accumulate_grad that fills a bucket.
SmallVector<unsigned> gradientCuts(SegmentOp seg,
                                   const llvm::SetVector<StringAttr> &zero,
                                   SymbolTable &symbols, double bucketSizeMb) {
  SmallVector<unsigned> cuts;
  double bytes = 0, limit = bucketSizeMb * 1024 * 1024;
  unsigned i = 0, numOps = 0;
  Block &body = seg.getBody().front();
  for (Operation &op : body.without_terminator())
    (void)op, ++numOps;
  for (Operation &op : body.without_terminator()) {
    ++i;
    auto acc = dyn_cast<AccumulateGradOp>(op);
    if (!acc || !zero.contains(acc.getParamAttr().getAttr()))
      continue;
    auto param = symbols.lookup<ParamOp>(acc.getParamAttr().getAttr());
    bytes += 4.0 * param.getTensorType().getNumElements();
    if (bytes >= limit && i < numOps) {
      cuts.push_back(i);
      bytes = 0;
    }
  }
  return cuts;
}

/// Recreates `t` with the results its segment has now (more than before).
TaskOp withSegmentResults(TaskOp t, SegmentOp seg) {
  OpBuilder b(t);
  auto nt = TaskOp::create(b, t.getLoc(), seg.getResultTypes(),
                           b.getType<TokenType>(), t.getSegmentAttr(),
                           t.getArgs(), t.getDeps(), t.getTag(),
                           t.getDevicesAttr(), t.getStreamAttr(),
                           t.getSendStreamAttr());
  for (NamedAttribute a : t->getDiscardableAttrs())
    nt->setDiscardableAttr(a.getName(), a.getValue());
  for (auto [o, n] : llvm::zip(t.getOuts(), nt.getOuts()))
    o.replaceAllUsesWith(n);
  t.getDone().replaceAllUsesWith(nt.getDone());
  t.erase();
  return nt;
}

} // namespace

LogicalResult mlir::piper::applyZero(ModuleOp module, ProgramOp program,
                                     const Directive &d,
                                     const llvm::SetVector<StringAttr> &params,
                                     ArrayRef<TaskOp> backward,
                                     TagAttr stageTag) {
  MLIRContext *ctx = module.getContext();
  OpBuilder b(ctx);
  SymbolTable symbols(module);
  auto group = DeviceGroupAttr::get(ctx, d.devices);
  StreamAttr reduceStream = commStream(program, d.reduceStream);
  StreamAttr gatherStream = commStream(program, d.gatherStream);
  IntegerAttr stage = b.getI64IntegerAttr(d.zero);
  SmallVector<Value> reduced;

  if (d.zero == 1) {
    // ZeRO-1: gradients accumulate whole over the microbatches, as without
    // ZeRO; one reduce-scatter per bucket after the last backward leaves
    // each member the range it updates.
    SmallVector<Value> deps;
    for (TaskOp t : backward)
      deps.push_back(t.getDone());
    TaskOp last = backward.back();
    b.setInsertionPointAfter(last);
    for (auto &bucket : bucketParams(symbols, params.getArrayRef(),
                                     d.bucketSizeMb)) {
      auto rs = ReduceScatterGradsOp::create(
          b, last.getLoc(), b.getType<TokenType>(), ValueRange(),
          b.getArrayAttr(bucket), stage, deps, group, reduceStream, stageTag,
          IntegerAttr(), ArrayAttr());
      reduced.push_back(rs.getDone());
    }
  } else {
    // ZeRO-2 and 3: no whole accumulator. Each backward segment is cut
    // into pieces of about a bucket of gradients; each piece hands its
    // gradients on, and a reduce-scatter per piece task (per microbatch)
    // adds each member's range into its sharded accumulator. Only the
    // gradients of the pieces in flight exist whole.
    llvm::MapVector<StringAttr, SegmentPieces> piecesOf;
    for (TaskOp t : backward) {
      StringAttr name = t.getSegmentAttr().getAttr();
      if (piecesOf.count(name))
        continue;
      auto seg = symbols.lookup<SegmentOp>(name);
      FailureOr<SegmentPieces> pieces =
          splitSegment(seg, gradientCuts(seg, params, symbols, d.bucketSizeMb));
      if (failed(pieces))
        return failure();
      for (SegmentOp piece : pieces->pieces)
        symbols.insert(piece);
      piecesOf[name] = std::move(*pieces);
    }
    // The gradients each piece yields, by piece name.
    llvm::DenseMap<StringAttr, SmallVector<StringAttr>> yielded;
    for (auto &entry : piecesOf)
      for (SegmentOp piece : entry.second.pieces)
        yielded[piece.getSymNameAttr()] = yieldGradients(piece, params);
    for (TaskOp old : backward) {
      const SegmentPieces &pieces = piecesOf[old.getSegmentAttr().getAttr()];
      for (TaskOp pt : splitTask(old, pieces)) {
        auto seg = symbols.lookup<SegmentOp>(pt.getSegment());
        ArrayRef<StringAttr> gradParams = yielded[seg.getSymNameAttr()];
        if (gradParams.empty())
          continue;
        TaskOp t = withSegmentResults(pt, seg);
        unsigned next = t.getOuts().size() - gradParams.size();
        b.setInsertionPointAfter(t);
        for (auto &bucket :
             bucketParams(symbols, gradParams, d.bucketSizeMb)) {
          SmallVector<Value> grads;
          for (size_t i = 0; i < bucket.size(); ++i)
            grads.push_back(t.getOuts()[next++]);
          auto rs = ReduceScatterGradsOp::create(
              b, t.getLoc(), b.getType<TokenType>(), grads,
              b.getArrayAttr(bucket), stage, ValueRange{t.getDone()}, group,
              reduceStream, t.getTag(), IntegerAttr(), ArrayAttr());
          reduced.push_back(rs.getDone());
        }
      }
    }
    for (auto &entry : piecesOf)
      symbols.erase(symbols.lookup<SegmentOp>(entry.first));
  }

  // Every update of a sharded parameter waits for its reductions; after
  // it, ZeRO-1 and 2 gather the updated ranges back into whole parameters.
  SegmentParams segmentParams(module);
  for (TaskOp u :
       llvm::make_early_inc_range(program.getBody().front().getOps<TaskOp>())) {
    if (!u.getTag().isPass(PassKind::U))
      continue;
    SmallVector<StringAttr> updated;
    for (StringAttr p : segmentParams.updated(u.getSegment()))
      if (params.contains(p))
        updated.push_back(p);
    if (updated.empty())
      continue;
    u.getDepsMutable().append(reduced);
    if (d.zero == 3)
      continue;
    b.setInsertionPointAfter(u);
    for (auto &bucket : bucketParams(symbols, updated, d.bucketSizeMb))
      AllGatherParamsOp::create(b, u.getLoc(), TypeRange(),
                                b.getType<TokenType>(), b.getArrayAttr(bucket),
                                stage, ValueRange{u.getDone()}, group,
                                gatherStream, stageTag, IntegerAttr(),
                                ArrayAttr());
  }
  return sortTopologically(program.getBody().front());
}

LogicalResult mlir::piper::boundZeroReductions(ModuleOp module) {
  // The gradients a backward task hands to its reduce-scatters live until
  // those finish. Nothing else stops a device's later backward tasks from
  // running ahead of the communication, holding every microbatch's
  // gradients at once; so backward task i + 2 of a device group waits for
  // the reduce-scatters of task i (two microbatches in flight: one reducing
  // while the next computes). Block order is the schedule's (the order
  // directives have run) and a topological one, so this adds no cycle.
  for (ProgramOp program : module.getOps<ProgramOp>()) {
    llvm::MapVector<std::pair<Attribute, Attribute>, SmallVector<TaskOp>>
        tasksOf; // (devices, stream) -> backward tasks with reductions
    llvm::DenseMap<Operation *, SmallVector<Value>> reductionsOf;
    for (auto rs : program.getBody().front().getOps<ReduceScatterGradsOp>()) {
      if (rs.getInputs().empty())
        continue;
      auto t = rs.getInputs().front().getDefiningOp<TaskOp>();
      if (!t)
        continue;
      auto &list = reductionsOf[t];
      if (list.empty())
        tasksOf[{t.getDevicesAttr(), t.getNodeStream()}].push_back(t);
      list.push_back(rs.getDone());
    }
    for (auto &entry : tasksOf) {
      SmallVector<TaskOp> &tasks = entry.second;
      llvm::sort(tasks, [](TaskOp a, TaskOp b) {
        return a->isBeforeInBlock(b);
      });
      for (size_t i = 2; i < tasks.size(); ++i)
        tasks[i].getDepsMutable().append(reductionsOf[tasks[i - 2]]);
    }
    if (failed(sortTopologically(program.getBody().front())))
      return failure();
  }
  return success();
}
