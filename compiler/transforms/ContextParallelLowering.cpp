// Context parallelism after placement (docs/context-parallel.md §3): each
// `piper.cp_attention` and `piper.cp_attention_grad` the rewrite and
// autodiff left becomes its ring of per-step kernels with an exchange
// (`piper.cp_ring_shift`) between steps. Ulysses' `piper.cp_seq_to_heads`
// and `piper.cp_heads_to_seq` become their layout kernels around a
// `piper.cp_all_to_all`; an MoE layer's `piper.cp_gather` (and its
// gradient) a `piper.cp_all_gather` (`piper.cp_reduce_scatter`) and the
// row order. Those exchanges are segment collectives:
// piper-lower-segment-collectives cuts the segments around them and makes
// each a node over the context-parallel groups of its task's devices.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
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
  for (SegmentOp seg : module.getOps<SegmentOp>()) {
    if (!hasContextParallelOps(seg))
      continue;
    Block &body = seg.getBody().front();
    for (CpAttentionOp op :
         llvm::make_early_inc_range(body.getOps<CpAttentionOp>()))
      expandForward(op);
    for (CpAttentionGradOp op :
         llvm::make_early_inc_range(body.getOps<CpAttentionGradOp>()))
      expandBackward(op);
    for (CpSeqToHeadsOp op :
         llvm::make_early_inc_range(body.getOps<CpSeqToHeadsOp>()))
      expandSeqToHeads(op);
    for (CpHeadsToSeqOp op :
         llvm::make_early_inc_range(body.getOps<CpHeadsToSeqOp>()))
      expandHeadsToSeq(op);
    for (CpGatherOp op : llvm::make_early_inc_range(body.getOps<CpGatherOp>()))
      expandGather(op);
    for (CpGatherGradOp op :
         llvm::make_early_inc_range(body.getOps<CpGatherGradOp>()))
      expandGatherGrad(op);
  }
  return success();
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
