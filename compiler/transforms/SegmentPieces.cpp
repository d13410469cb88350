// Splitting a segment into consecutive pieces, and every task that calls it
// into a chain of tasks: what lets ZeRO reduce a backward's gradients and
// gather a forward's parameters bucket by bucket instead of all at once.
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"

using namespace mlir;
using namespace mlir::piper;

FailureOr<SegmentPieces> mlir::piper::splitSegment(SegmentOp seg,
                                                   ArrayRef<unsigned> cuts) {
  Block &body = seg.getBody().front();
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  for (auto [i, c] : llvm::enumerate(cuts))
    if (c == 0 || c >= ops.size() || (i > 0 && c <= cuts[i - 1]))
      return seg.emitOpError("cannot be split before op ")
             << c << " (cuts must increase within its " << ops.size()
             << " ops)";
  DenseMap<Operation *, unsigned> pieceOf;
  for (unsigned k = 0, i = 0; i < ops.size(); ++i) {
    while (k < cuts.size() && i >= cuts[k])
      ++k;
    pieceOf[ops[i]] = k;
  }
  SmallVector<std::string> names;
  for (unsigned j = 0; j <= cuts.size(); ++j)
    names.push_back((seg.getSymName() + "." + Twine(j)).str());
  return splitSegmentByOps(seg, pieceOf, names, cuts.size());
}

FailureOr<SegmentPieces> mlir::piper::splitSegmentByOps(
    SegmentOp seg, const DenseMap<Operation *, unsigned> &pieceOf,
    ArrayRef<std::string> names, unsigned passThroughPiece) {
  Block &body = seg.getBody().front();
  auto yield = cast<YieldOp>(body.getTerminator());
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  unsigned numPieces = names.size();
  // What crosses pieces: a value defined in piece i and read in piece j > i
  // is an output of i and an input of j. Parameter reads never cross: each
  // piece reads the parameter itself.
  SmallVector<llvm::SetVector<Value>> inputs(numPieces), outputs(numPieces);
  auto isParamRead = [](Value v) {
    return v.getDefiningOp<ParamRefOp>() != nullptr;
  };
  bool failedOrder = false;
  auto need = [&](Value v, unsigned j) {
    if (isParamRead(v))
      return;
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      inputs[j].insert(v);
      return;
    }
    unsigned i = pieceOf.lookup(v.getDefiningOp());
    if (i == j)
      return;
    if (i > j) {
      failedOrder = true;
      return;
    }
    outputs[i].insert(v);
    inputs[j].insert(v);
  };
  for (Operation *op : ops) {
    if (isa<ParamRefOp>(op))
      continue;
    unsigned j = pieceOf.lookup(op);
    op->walk([&](Operation *nested) {
      for (Value v : nested->getOperands())
        if (v.getParentBlock() == &body)
          need(v, j);
    });
  }
  if (failedOrder)
    return seg.emitOpError("cannot be split: a piece reads a value of a "
                           "later piece");
  // The segment's results leave from the piece that computes them (an
  // argument passed through leaves from piece passThroughPiece).
  for (Value v : yield.getValues()) {
    if (isParamRead(v))
      return yield.emitOpError("cannot return a parameter from a piece");
    if (isa<BlockArgument>(v)) {
      inputs[passThroughPiece].insert(v);
      outputs[passThroughPiece].insert(v);
    } else {
      outputs[pieceOf.lookup(v.getDefiningOp())].insert(v);
    }
  }

  SegmentPieces out;
  OpBuilder b(seg);
  b.setInsertionPointAfter(seg);
  DenseMap<Value, std::pair<int, unsigned>> sourceOf; // value -> (piece, out)
  for (auto [k, arg] : llvm::enumerate(body.getArguments()))
    sourceOf[arg] = {-1, static_cast<unsigned>(k)};
  for (unsigned j = 0; j < numPieces; ++j) {
    SmallVector<Type> inTypes, outTypes;
    for (Value v : inputs[j])
      inTypes.push_back(v.getType());
    for (Value v : outputs[j])
      outTypes.push_back(v.getType());
    auto piece = SegmentOp::create(b, seg.getLoc(), names[j],
                                   b.getFunctionType(inTypes, outTypes));
    for (NamedAttribute a : seg->getDiscardableAttrs())
      piece->setDiscardableAttr(a.getName(), a.getValue());
    b.setInsertionPointAfter(piece);
    Block &pb = piece.getBody().front();
    IRMapping map;
    SmallVector<PieceSource> sources;
    for (auto [v, arg] : llvm::zip(inputs[j], pb.getArguments())) {
      map.map(v, arg);
      auto [p, index] = sourceOf.lookup(v);
      // A passed-through argument is also an output of this piece; its
      // source is the task argument.
      sources.push_back(PieceSource{p, index});
    }
    OpBuilder pbuilder = OpBuilder::atBlockEnd(&pb);
    for (Operation *op : ops) {
      if (pieceOf.lookup(op) != j || isa<ParamRefOp>(op))
        continue;
      op->walk([&](Operation *nested) {
        for (Value v : nested->getOperands())
          if (auto ref = v.getDefiningOp<ParamRefOp>(); ref && !map.contains(v))
            map.map(v, pbuilder.clone(*ref)->getResult(0));
      });
      pbuilder.clone(*op, map);
    }
    SmallVector<Value> results;
    for (auto [k, v] : llvm::enumerate(outputs[j])) {
      results.push_back(map.lookup(v));
      if (!isa<BlockArgument>(v))
        sourceOf[v] = {static_cast<int>(j), static_cast<unsigned>(k)};
    }
    YieldOp::create(pbuilder, yield.getLoc(), results);
    out.outputValues.emplace_back(outputs[j].begin(), outputs[j].end());
    out.pieces.push_back(piece);
    out.inputs.push_back(std::move(sources));
  }
  // Passed-through arguments leave from piece passThroughPiece, at their
  // position among its outputs.
  for (Value v : yield.getValues()) {
    if (isa<BlockArgument>(v)) {
      unsigned k = llvm::find(outputs[passThroughPiece], v) -
                   outputs[passThroughPiece].begin();
      out.results.push_back(PieceSource{static_cast<int>(passThroughPiece), k});
    } else {
      auto [p, k] = sourceOf.lookup(v);
      out.results.push_back(PieceSource{p, k});
    }
  }
  return out;
}

FailureOr<SegmentPieces> mlir::piper::splitAround(
    SegmentOp seg, llvm::function_ref<bool(Operation &)> isMarker,
    SymbolTable &symbols, llvm::function_ref<bool(Operation &)> cutBefore) {
  SmallVector<unsigned> cuts;
  auto ops = seg.getBody().front().without_terminator();
  const unsigned numOps = std::distance(ops.begin(), ops.end());
  unsigned i = 0;
  // No cut before the first op or after the last: a marker there is a
  // piece of its own already.
  for (Operation &op : ops) {
    bool marker = isMarker(op);
    if ((marker || (cutBefore && cutBefore(op))) && i > 0 &&
        (cuts.empty() || cuts.back() != i))
      cuts.push_back(i);
    if (marker && i + 1 < numOps)
      cuts.push_back(i + 1);
    ++i;
  }
  FailureOr<SegmentPieces> pieces = splitSegment(seg, cuts);
  if (failed(pieces))
    return failure();
  for (SegmentOp piece : pieces->pieces)
    symbols.insert(piece);
  return pieces;
}

TaskOp mlir::piper::createPieceTask(OpBuilder &b, TaskOp t, SegmentOp piece,
                                    ValueRange args, ValueRange deps) {
  auto nt = TaskOp::create(
      b, t.getLoc(), piece.getResultTypes(), b.getType<TokenType>(),
      FlatSymbolRefAttr::get(piece.getSymNameAttr()), args, deps, t.getTag(),
      t.getDevicesAttr(), t.getStreamAttr(), t.getSendStreamAttr());
  for (NamedAttribute a : t->getDiscardableAttrs())
    nt->setDiscardableAttr(a.getName(), a.getValue());
  return nt;
}

SmallVector<PieceNode> mlir::piper::splitTaskWith(TaskOp t,
                                                  const SegmentPieces &pieces,
                                                  PieceBuilder special) {
  OpBuilder b(t);
  SmallVector<PieceNode> nodes;
  // What the next piece waits for: the task's dependencies, then the last
  // chained node's token.
  SmallVector<Value> deps(t.getDeps().begin(), t.getDeps().end());
  Value last;
  for (unsigned j = 0; j < pieces.pieces.size(); ++j) {
    SmallVector<Value> args;
    for (const PieceSource &s : pieces.inputs[j])
      args.push_back(s.piece < 0 ? t.getArgs()[s.index]
                                 : nodes[s.piece].outs[s.index]);
    std::optional<PieceNode> node = special(b, j, args, deps);
    if (!node) {
      TaskOp nt = createPieceTask(b, t, pieces.pieces[j], args, deps);
      node = PieceNode{nt, SmallVector<Value>(nt.getOuts()), nt.getDone()};
    }
    if (node->chained) {
      deps.assign(1, node->done);
      last = node->done;
    }
    nodes.push_back(std::move(*node));
  }
  for (auto [r, s] : llvm::enumerate(pieces.results))
    t.getOuts()[r].replaceAllUsesWith(nodes[s.piece].outs[s.index]);
  // An unchained node's readers wait for it through its result; the
  // task's token is the chain's.
  t.getDone().replaceAllUsesWith(last ? last : nodes.back().done);
  t.erase();
  return nodes;
}

SmallVector<TaskOp> mlir::piper::splitTask(TaskOp t,
                                           const SegmentPieces &pieces) {
  SmallVector<TaskOp> tasks;
  for (const PieceNode &n : splitTaskWith(
           t, pieces,
           [](OpBuilder &, unsigned, ArrayRef<Value>, ArrayRef<Value>) {
             return std::optional<PieceNode>();
           }))
    tasks.push_back(cast<TaskOp>(n.op));
  return tasks;
}

void mlir::piper::hoistAccumulations(SegmentOp seg) {
  Block &body = seg.getBody().front();
  SmallVector<AccumulateGradOp> accs(body.getOps<AccumulateGradOp>());
  llvm::DenseMap<StringAttr, Operation *> last;
  for (AccumulateGradOp acc : accs) {
    Operation *after = nullptr;
    if (Operation *def = acc.getGrad().getDefiningOp())
      after = body.findAncestorOpInBlock(*def);
    StringAttr param = acc.getParamAttr().getAttr();
    Operation *prev = last.lookup(param);
    if (prev && (!after || after->isBeforeInBlock(prev)))
      after = prev;
    if (after)
      acc->moveAfter(after);
    else
      acc->moveBefore(&body.front());
    last[param] = acc;
  }
}

bool mlir::piper::isSegmentCollective(Operation &op, Axis axis) {
  auto c = dyn_cast<SegmentCollectiveOpInterface>(op);
  return c && c.getCollectiveAxis() == axis;
}

SegmentCollectiveOpInterface
mlir::piper::soleSegmentCollective(SegmentOp piece) {
  return soleOp<SegmentCollectiveOpInterface>(piece);
}

/// The program node the segment collective `marker` (alone in the piece
/// of task `t` that reads `args` after `deps`, with outputs `outputs`)
/// becomes (splitTaskAtCollectives).
static PieceNode createSegmentCollectiveNode(
    OpBuilder &b, TaskOp t, SegmentCollectiveOpInterface marker,
    ArrayRef<Value> args, ArrayRef<Value> deps,
    const CollectiveBinding &binding, ArrayRef<Value> outputs) {
  Location loc = t.getLoc();
  DeviceGroupAttr group = t.getDevicesAttr();
  ArrayAttr subgroups = binding.subgroups;
  StreamAttr stream = binding.stream;
  bool overlap = binding.overlap;
  Type token = b.getType<TokenType>();
  Type type = marker->getResult(0).getType();
  switch (marker.getCollectiveKind()) {
  case SegmentCollectiveKind::AllReduce: {
    auto node = AllReduceOp::create(b, loc, ValueRange{args[0]}, deps, group,
                                    stream, t.getTag());
    if (subgroups)
      node.setSubgroupsAttr(subgroups);
    return PieceNode{node, {node.getResults()[0]}, node.getDone()};
  }
  case SegmentCollectiveKind::AllGather: {
    auto node =
        AllGatherOp::create(b, loc, type, token, args[0], deps, group, stream,
                            t.getTag(), IntegerAttr(), subgroups);
    return PieceNode{node, {node.getResult()}, node.getDone()};
  }
  case SegmentCollectiveKind::ReduceScatter: {
    auto node =
        ReduceScatterOp::create(b, loc, type, token, args[0], deps, group,
                                stream, t.getTag(), IntegerAttr(), subgroups);
    return PieceNode{node, {node.getResult()}, node.getDone()};
  }
  case SegmentCollectiveKind::AllToAll: {
    // Rows and their per-member counts: the piece's outputs are either.
    auto node = AllToAllOp::create(b, loc, args[0].getType(), args[1].getType(),
                                   token, args[0], args[1], deps, group, stream,
                                   t.getTag(), IntegerAttr(), subgroups);
    PieceNode n{node, {}, node.getDone()};
    for (Value v : outputs)
      n.outs.push_back(cast<OpResult>(v).getResultNumber() == 0
                           ? node.getResult()
                           : node.getRecvCounts());
    return n;
  }
  case SegmentCollectiveKind::RingShift: {
    // Overlapped, it is ordered by its data alone: it runs beside the
    // pieces after it until one reads its result. Otherwise it waits for
    // the piece before it and the next waits for it.
    auto shift = cast<CpRingShiftOp>(marker.getOperation());
    auto node = RingShiftOp::create(b, loc, args[0].getType(), token, args[0],
                                    overlap ? ArrayRef<Value>() : deps, group,
                                    subgroups, shift.getOffsetAttr(), stream,
                                    t.getTag());
    return PieceNode{node, {node.getResult()}, node.getDone(), !overlap};
  }
  }
  llvm_unreachable("unknown segment collective kind");
}

SmallVector<PieceNode> mlir::piper::splitTaskAtCollectives(
    TaskOp t, const SegmentPieces &pieces,
    llvm::function_ref<CollectiveBinding(SegmentCollectiveOpInterface)>
        bindingOf) {
  return splitTaskWith(t, pieces,
                       [&](OpBuilder &b, unsigned j, ArrayRef<Value> args,
                           ArrayRef<Value> deps) -> std::optional<PieceNode> {
                         SegmentCollectiveOpInterface marker =
                             soleSegmentCollective(pieces.pieces[j]);
                         if (!marker)
                           return std::nullopt;
                         return createSegmentCollectiveNode(
                             b, t, marker, args, deps, bindingOf(marker),
                             pieces.outputValues[j]);
                       });
}

void mlir::piper::eraseUncalledSegments(
    ProgramOp program, SymbolTable &symbols,
    const llvm::MapVector<StringAttr, SegmentPieces> &piecesOf) {
  llvm::DenseSet<StringAttr> called;
  program.walk([&](TaskOp t) { called.insert(t.getSegmentAttr().getAttr()); });
  for (const auto &entry : piecesOf)
    if (!called.contains(entry.first))
      symbols.erase(symbols.lookup(entry.first));
}
