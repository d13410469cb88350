// Context parallelism after placement (docs/context-parallel.md §3): each
// `piper.cp_attention` and `piper.cp_attention_grad` the rewrite and
// autodiff left becomes its ring of per-step kernels, the segment is cut
// around the exchanges between steps, and each exchange becomes a
// `piper.ring_shift` node over the context-parallel rings of its task's
// devices, on the directive's stream. Ulysses' `piper.cp_seq_to_heads`
// and `piper.cp_heads_to_seq` become their layout kernels around a
// `piper.all_to_all` node over the same groups; an MoE layer's
// `piper.cp_gather` (and its gradient) an all-gather (reduce-scatter) node
// and the row order.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERLOWERCONTEXTPARALLEL
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

/// The key and value columns of `op`'s packed q|k|v (after the query
/// columns, as many as its output `out` has): what the ring passes
/// around, no query bytes on the wire.
template <typename OpT>
static Value keyValueColumns(OpBuilder &b, OpT op, Value out) {
  auto qkv = cast<RankedTensorType>(op.getQkv().getType());
  int64_t queryCols = cast<RankedTensorType>(out.getType()).getDimSize(1);
  auto type = RankedTensorType::get(
      {qkv.getDimSize(0), qkv.getDimSize(1) - queryCols}, b.getF32Type());
  return ColumnsOp::create(b, op.getLoc(), type, op.getQkv(),
                           b.getI64IntegerAttr(queryCols));
}

/// Ring attention's forward: the member's key/value columns, then cp
/// steps, each over the shard the previous step's member held (the shard
/// moves one member forward between steps: step s reads owner
/// (member - s) mod cp's). The shard for step s + 1 is passed on before
/// step s computes, so the exchange runs beside it.
static void expandForward(CpAttentionOp op) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  int64_t cp = op.getCp();
  SmallVector<Value> kvs{keyValueColumns(b, op, op.getResult())};
  Value o, lse;
  for (int64_t s = 0; s < cp; ++s) {
    if (s + 1 < cp)
      kvs.push_back(CpRingShiftOp::create(
          b, loc, kvs.back(), b.getI64IntegerAttr(cp), b.getI64IntegerAttr(1)));
    Value kv = kvs[s];
    SmallVector<Value> carry;
    if (s > 0)
      carry = {o, lse};
    auto block = AttentionBlockOp::create(
        b, loc, op.getResult().getType(), op.getLse().getType(), op.getQkv(),
        kv, carry, op.getHeadsAttr(), op.getSeqAttr(), op.getKvHeadsAttr(),
        op.getRopeThetaAttr(), op.getCpAttr(), b.getI64IntegerAttr(s),
        op.getRopeScalingAttr());
    o = block.getResult();
    lse = block.getLse();
  }
  op.getResult().replaceAllUsesWith(o);
  op.getLse().replaceAllUsesWith(lse);
  op.erase();
}

/// Ring attention's backward, the other way around: step s reads owner
/// (member + s) mod cp's keys and values, and adds this member's part of
/// that owner's key/value gradient to the sum the members before it
/// passed on; a last exchange hands each owner its sum. The query
/// gradient stays with the member. Both exchanges of a step run beside
/// the step before it: the keys and values for step s + 1 are passed on
/// before step s computes, and step s computes its parts alone, adding
/// the passed sum (and the query gradient so far) after it, in the order
/// the carrying kernel adds (its part, then the sum).
static void expandBackward(CpAttentionGradOp op) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  int64_t cp = op.getCp();
  auto qkvType = cast<RankedTensorType>(op.getQkv().getType());
  SmallVector<Value> kvs{keyValueColumns(b, op, op.getY())};
  auto kvType = cast<RankedTensorType>(kvs[0].getType());
  int64_t queryCols = cast<RankedTensorType>(op.getY().getType()).getDimSize(1);
  auto shift = [&](Value v) -> Value {
    return CpRingShiftOp::create(b, loc, v, b.getI64IntegerAttr(cp),
                                 b.getI64IntegerAttr(-1));
  };
  Value dq, dkv, partDkv, passed;
  for (int64_t s = 0; s < cp; ++s) {
    if (s > 0) {
      // The previous step's sum, once its part is in, goes on.
      dkv = passed ? AddOp::create(b, loc, kvType, partDkv, passed).getResult()
                   : partDkv;
    }
    if (s + 1 < cp)
      kvs.push_back(shift(kvs.back()));
    if (s > 0)
      passed = shift(dkv);
    auto block = AttentionBlockGradOp::create(
        b, loc, op.getY().getType(), kvType, op.getQkv(), kvs[s], op.getY(),
        op.getLse(), op.getGrad(), ValueRange(), op.getHeadsAttr(),
        op.getSeqAttr(), op.getKvHeadsAttr(), op.getRopeThetaAttr(),
        op.getCpAttr(), b.getI64IntegerAttr(s), op.getRopeScalingAttr());
    dq = dq ? AddOp::create(b, loc, dq.getType(), block.getDq(), dq).getResult()
            : block.getDq();
    partDkv = block.getDkv();
  }
  dkv =
      shift(passed ? AddOp::create(b, loc, kvType, partDkv, passed).getResult()
                   : partDkv);
  Value dqFull =
      ColumnsGradOp::create(b, loc, qkvType, dq, b.getI64IntegerAttr(0));
  Value dkvFull = ColumnsGradOp::create(b, loc, qkvType, dkv,
                                        b.getI64IntegerAttr(queryCols));
  Value dqkv = AddOp::create(b, loc, qkvType, dqFull, dkvFull);
  op.getResult().replaceAllUsesWith(dqkv);
  op.erase();
}

/// Ulysses, sequence to heads: the member's rows as blocks of each
/// member's heads, the all-to-all, the received rows in sequence order.
static void expandSeqToHeads(CpSeqToHeadsOp op) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  Type type = op.getResult().getType();
  auto counts = RankedTensorType::get({int64_t(op.getCp())}, b.getI32Type());
  auto split = CpUlyssesSplitOp::create(b, loc, type, counts, op.getInput(),
                                        op.getCpAttr(), op.getHeadsAttr(),
                                        op.getKvHeadsAttr());
  auto sent = CpAllToAllOp::create(b, loc, type, counts, split.getResult(),
                                   split.getCounts(), op.getCpAttr());
  auto natural = CpUlyssesNaturalOp::create(b, loc, type, sent.getResult(),
                                            op.getCpAttr(), op.getSeqAttr());
  op.getResult().replaceAllUsesWith(natural.getResult());
  op.erase();
}

/// Ulysses, heads to sequence: the rows in blocks of each member's rows,
/// the all-to-all, the received blocks side by side.
static void expandHeadsToSeq(CpHeadsToSeqOp op) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  Type type = op.getInput().getType();
  auto counts = RankedTensorType::get({int64_t(op.getCp())}, b.getI32Type());
  auto zigzag = CpUlyssesZigzagOp::create(b, loc, type, counts, op.getInput(),
                                          op.getCpAttr(), op.getSeqAttr());
  auto sent = CpAllToAllOp::create(b, loc, type, counts, zigzag.getResult(),
                                   zigzag.getCounts(), op.getCpAttr());
  auto merged = CpUlyssesMergeOp::create(
      b, loc, op.getResult().getType(), sent.getResult(), op.getCpAttr(),
      op.getHeadsAttr(), op.getKvHeadsAttr());
  op.getResult().replaceAllUsesWith(merged.getResult());
  op.erase();
}

/// MoE layers under context parallelism: the gather is an all-gather in
/// member order, then sequence order; its gradient the way back, summed.
static void expandGather(CpGatherOp op) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  Type type = op.getResult().getType();
  auto all = CpAllGatherOp::create(b, loc, type, op.getInput(), op.getCpAttr());
  auto natural = CpUlyssesNaturalOp::create(b, loc, type, all.getResult(),
                                            op.getCpAttr(), op.getSeqAttr());
  op.getResult().replaceAllUsesWith(natural.getResult());
  op.erase();
}

static void expandGatherGrad(CpGatherGradOp op) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  Type type = op.getInput().getType();
  auto counts = RankedTensorType::get({int64_t(op.getCp())}, b.getI32Type());
  auto zigzag = CpUlyssesZigzagOp::create(b, loc, type, counts, op.getInput(),
                                          op.getCpAttr(), op.getSeqAttr());
  auto summed = CpReduceScatterOp::create(b, loc, op.getResult().getType(),
                                          zigzag.getResult(), op.getCpAttr());
  op.getResult().replaceAllUsesWith(summed.getResult());
  op.erase();
}

static bool isExchange(Operation &op) {
  return isSegmentCollective(op, Axis::cp);
}

/// Whether `seg` holds context-parallel ops to lower.
static bool hasContextParallelOps(SegmentOp seg) {
  Block &body = seg.getBody().front();
  return !body.getOps<CpAttentionOp>().empty() ||
         !body.getOps<CpAttentionGradOp>().empty() ||
         !body.getOps<CpSeqToHeadsOp>().empty() ||
         !body.getOps<CpHeadsToSeqOp>().empty() ||
         !body.getOps<CpGatherOp>().empty() ||
         !body.getOps<CpGatherGradOp>().empty();
}

LogicalResult mlir::piper::lowerContextParallel(ModuleOp module) {
  int64_t cp = getMesh(module).getCp();
  if (cp < 2) {
    WalkResult stray = module.walk([](Operation *op) {
      if (!isa<CpAttentionOp, CpAttentionGradOp, AttentionBlockOp,
               AttentionBlockGradOp, CpRingShiftOp, CpSeqToHeadsOp,
               CpHeadsToSeqOp, CpUlyssesSplitOp, CpUlyssesMergeOp,
               CpUlyssesNaturalOp, CpUlyssesZigzagOp, CpAllToAllOp, CpGatherOp,
               CpGatherGradOp, CpSplitOp, CpSplitGradOp, CpAllGatherOp,
               CpReduceScatterOp>(op))
        return WalkResult::advance();
      op->emitOpError("needs the module's context-parallel degree "
                      "(the cp of piper.mesh, set by context_parallel)");
      return WalkResult::interrupt();
    });
    return failure(stray.wasInterrupted());
  }
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  WalkResult wrong = module.walk([&](Operation *op) {
    auto attr = op->getAttrOfType<IntegerAttr>("cp");
    if (!isa<CpAttentionOp, CpAttentionGradOp, CpSeqToHeadsOp, CpHeadsToSeqOp,
             CpGatherOp, CpGatherGradOp, CpSplitOp, CpSplitGradOp>(op) ||
        attr.getInt() == cp)
      return WalkResult::advance();
    op->emitOpError("is split over ")
        << attr.getInt() << " members, but the module's context-parallel "
        << "degree is " << cp;
    return WalkResult::interrupt();
  });
  if (wrong.wasInterrupted())
    return failure();
  int64_t tp = getMesh(module).getTp();
  MLIRContext *ctx = module.getContext();
  StreamAttr stream = commStream(*program, getContextParallelStream(module));
  bool overlap = getContextParallelOverlap(module);
  SymbolTable symbols(module);
  llvm::MapVector<StringAttr, SegmentPieces> piecesOf;
  SmallVector<std::pair<TaskOp, ArrayAttr>> tasks;
  for (TaskOp t : program->getBody().front().getOps<TaskOp>()) {
    StringAttr name = t.getSegmentAttr().getAttr();
    auto seg = symbols.lookup<SegmentOp>(name);
    if (!seg || (!piecesOf.count(name) && !hasContextParallelOps(seg)))
      continue;
    ArrayRef<int64_t> devices =
        t.getDevices() ? t.getNodeDevices() : ArrayRef<int64_t>();
    int64_t group = cp * tp;
    if (devices.empty() || devices.size() % group != 0)
      return t.emitOpError()
             << describeNode(t) << " runs on "
             << (devices.empty() ? std::string("no device")
                                 : formatDevices(devices))
             << ", which is not made of whole context-parallel groups of " << cp
             << (tp > 1
                     ? " (times tensor parallelism " + std::to_string(tp) + ")"
                     : std::string())
             << "; place its stage on a multiple of " << group << " devices";
    // The rings: the layout's cp groups of the class (tp innermost, then
    // cp, then dp: docs/context-parallel.md).
    tasks.push_back(
        {t, ArrayAttr::get(
                ctx, deviceGroupAttrs(ctx, devices,
                                      getMesh(module).layout(devices.size()),
                                      Axis::cp))});
    if (piecesOf.count(name))
      continue;
    for (CpAttentionOp op : llvm::make_early_inc_range(
             seg.getBody().front().getOps<CpAttentionOp>()))
      expandForward(op);
    for (CpAttentionGradOp op : llvm::make_early_inc_range(
             seg.getBody().front().getOps<CpAttentionGradOp>()))
      expandBackward(op);
    for (CpSeqToHeadsOp op : llvm::make_early_inc_range(
             seg.getBody().front().getOps<CpSeqToHeadsOp>()))
      expandSeqToHeads(op);
    for (CpHeadsToSeqOp op : llvm::make_early_inc_range(
             seg.getBody().front().getOps<CpHeadsToSeqOp>()))
      expandHeadsToSeq(op);
    for (CpGatherOp op :
         llvm::make_early_inc_range(seg.getBody().front().getOps<CpGatherOp>()))
      expandGather(op);
    for (CpGatherGradOp op : llvm::make_early_inc_range(
             seg.getBody().front().getOps<CpGatherGradOp>()))
      expandGatherGrad(op);
    hoistAccumulations(seg);
    // A piece starts at each op that reads what the ring passed (a step
    // over a passed shard, the addition of a passed gradient sum): the
    // work before it need not wait for the exchange, which runs beside it.
    FailureOr<SegmentPieces> pieces =
        splitAround(seg, isExchange, symbols, [](Operation &op) {
          return llvm::any_of(op.getOperands(), [](Value v) {
            return v.getDefiningOp<CpRingShiftOp>() != nullptr;
          });
        });
    if (failed(pieces))
      return failure();
    piecesOf[name] = std::move(*pieces);
  }
  for (auto [t, rings] : tasks) {
    const SegmentPieces &pieces = piecesOf[t.getSegmentAttr().getAttr()];
    splitTaskAtCollectives(t, pieces, t.getDevicesAttr(), stream, rings,
                           overlap);
  }
  for (auto &entry : piecesOf) {
    for (SegmentOp piece : entry.second.pieces)
      if (soleSegmentCollective(piece))
        symbols.erase(piece);
    symbols.erase(symbols.lookup<SegmentOp>(entry.first));
  }
  return sortTopologically(program->getBody().front());
}

namespace {
struct LowerContextParallelPass
    : mlir::piper::impl::PiperLowerContextParallelBase<
          LowerContextParallelPass> {
  void runOnOperation() override {
    if (failed(lowerContextParallel(getOperation())))
      signalPassFailure();
  }
};
} // namespace
