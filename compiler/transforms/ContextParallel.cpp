// Context parallelism (docs/context-parallel.md). The `context_parallel`
// directive rewrites the forward model before stage: every microbatch's
// sequence of S tokens is split over the cp members of a context-parallel
// group, member m holding chunks m and 2 cp - 1 - m of the 2 cp equal
// chunks (Megatron's load-balanced causal layout; the runtime's batch
// loader gives each member those tokens and targets). Every value with a
// row per token then holds the member's B S / cp rows; row-wise ops
// (embeddings, norms, linear layers, activations, residual adds, the
// loss) need nothing else, and attention becomes ring attention
// (`piper.cp_attention`), which piper-lower-context-parallel lowers after
// placement to per-step kernels and ring exchanges, or, of kind ulysses,
// plain attention over every row of the member's share of the heads
// between `piper.cp_seq_to_heads` and `piper.cp_heads_to_seq`, lowered
// there to all-to-alls. No parameter is split:
// the members are gradient replicas (replicate sums over data x context).
// MoE layers run on the whole sequence, gathered before them (cp_gather)
// and split after (cp_split), so that routing, capacity and the auxiliary
// loss are one device's. Under tensor parallelism (shard_tensor runs
// first) each member's rows go
// through the tensor-parallel block as the whole rows did: attention over
// the tensor member's heads, sequence parallelism splitting the member's
// rows.
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseSet.h"

using namespace mlir;
using namespace mlir::piper;

namespace {
class ContextParallel {
public:
  ContextParallel(ModuleOp module, const Directive &d)
      : module(module), d(d), cp(d.get<ContextParallelOptions>().cp),
        symbols(module) {}

  LogicalResult run(ProgramOp program);

private:
  InFlightDiagnostic fail(Operation *at) {
    return at->emitOpError(d.describe()) << ": ";
  }
  /// Splits the ops of `seg` that read the member's rows; `sharded` holds
  /// the segment's values that are rows.
  LogicalResult rewrite(SegmentOp seg, llvm::DenseSet<Value> &sharded);
  /// Ulysses: `attn` over every row of the member's share of the heads,
  /// between all-to-alls; its result is the member's rows.
  FailureOr<Value> ulysses(AttentionOp attn);
  /// `t` with its first dimension (the rows) divided by cp.
  RankedTensorType part(Type t) {
    auto r = cast<RankedTensorType>(t);
    SmallVector<int64_t> shape(r.getShape());
    shape[0] /= cp;
    return RankedTensorType::get(shape, r.getElementType());
  }

  ModuleOp module;
  const Directive &d;
  int64_t cp;
  SymbolTable symbols;
  /// Rows of a whole microbatch (B S) and the sequence length S.
  int64_t rows = 0, seq = 0;
  /// The tensor-parallel degree (shard_tensor ran first): under sequence
  /// parallelism a value may hold rows / tp of the rows.
  int64_t tp = 1;
};
} // namespace

FailureOr<Value> ContextParallel::ulysses(AttentionOp attn) {
  int64_t heads = attn.getHeads(), kv = attn.getNumKvHeads();
  if (heads % cp != 0 || kv % cp != 0)
    return fail(attn) << "Ulysses gives each of the cp = " << cp
                      << " members a share of attention's heads, but it has "
                      << heads << " query and " << kv << " key/value heads"
                      << (tp > 1 ? " per tensor-parallel member" : "")
                      << "; use a cp that divides both, "
                         "or ring attention (--cp-kind ring)";
  OpBuilder b(attn);
  Location loc = attn.getLoc();
  auto qkv = cast<RankedTensorType>(attn.getQkv().getType());
  auto y = cast<RankedTensorType>(attn.getResult().getType());
  // Every row of the microbatch, the member's share of the columns.
  auto narrow = [&](RankedTensorType t) {
    return RankedTensorType::get({rows, t.getDimSize(1) / cp},
                                 t.getElementType());
  };
  IntegerAttr cpAttr = b.getI64IntegerAttr(cp), seqAttr = attn.getSeqAttr();
  IntegerAttr kvAttr = b.getI64IntegerAttr(kv);
  auto toHeads =
      CpSeqToHeadsOp::create(b, loc, narrow(qkv), attn.getQkv(), cpAttr,
                             seqAttr, attn.getHeadsAttr(), kvAttr);
  // The forward model's lse has no uses yet (the backward reads it).
  if (!attn.getLse().use_empty())
    return fail(attn) << "Ulysses needs attention's lse unused before "
                         "differentiation";
  auto lse = RankedTensorType::get({rows, 2 * (heads / cp)}, b.getF32Type());
  auto core = AttentionOp::create(
      b, loc, narrow(y), lse, toHeads.getResult(),
      b.getI64IntegerAttr(heads / cp), seqAttr,
      attn.getKvHeads() ? b.getI64IntegerAttr(kv / cp) : IntegerAttr(),
      attn.getRopeThetaAttr(), attn.getRopeScalingAttr());
  for (NamedAttribute a : attn->getDiscardableAttrs())
    core->setDiscardableAttr(a.getName(), a.getValue());
  auto toSeq =
      CpHeadsToSeqOp::create(b, loc, part(y), core.getResult(), cpAttr, seqAttr,
                             attn.getHeadsAttr(), IntegerAttr());
  attn.getResult().replaceAllUsesWith(toSeq.getResult());
  attn.erase();
  return toSeq.getResult();
}

LogicalResult ContextParallel::rewrite(SegmentOp seg,
                                       llvm::DenseSet<Value> &sharded) {
  Block &body = seg.getBody().front();
  // MoE layers run on the whole sequence (docs/context-parallel.md §4):
  // what they read of the member's rows is gathered (once per value), and
  // what the member's rows read of their results split back.
  llvm::DenseMap<Value, Value> gatherOf;
  llvm::DenseSet<Value> gathered;
  auto splitGathered = [&](Operation &op) -> LogicalResult {
    for (OpOperand &use : op.getOpOperands()) {
      if (!gathered.contains(use.get()))
        continue;
      auto t = cast<RankedTensorType>(use.get().getType());
      if (t.getRank() == 0)
        continue;
      if (t.getRank() != 2 || t.getDimSize(0) != rows ||
          !t.getElementType().isF32())
        return fail(&op) << "reads " << t
                         << " of an MoE layer, which is not a row per token "
                            "of the sequence ("
                         << rows << " rows)";
      OpBuilder b(&op);
      auto split =
          CpSplitOp::create(b, op.getLoc(), part(t), use.get(),
                            b.getI64IntegerAttr(cp), b.getI64IntegerAttr(seq));
      use.set(split);
      sharded.insert(split);
    }
    return success();
  };
  for (Operation &op : llvm::make_early_inc_range(body.without_terminator())) {
    bool reads = llvm::any_of(op.getOperands(),
                              [&](Value v) { return sharded.contains(v); });
    bool readsGathered = llvm::any_of(
        op.getOperands(), [&](Value v) { return gathered.contains(v); });
    if (!reads && !readsGathered)
      continue;
    if (isa<MoeRouterOp, MoeDispatchOp, ExpertLinearOp, MoeCombineOp,
            MoeAuxLossOp>(op) ||
        !reads) {
      for (OpOperand &use : op.getOpOperands()) {
        if (!sharded.contains(use.get()))
          continue;
        auto t = cast<RankedTensorType>(use.get().getType());
        if (t.getRank() != 2 || t.getDimSize(0) * cp != rows ||
            !t.getElementType().isF32())
          return fail(&op) << op.getName() << " reads " << t
                           << ", which context parallelism cannot gather into "
                              "the sequence's "
                           << rows << " rows";
        Value &all = gatherOf[use.get()];
        if (!all) {
          OpBuilder b(&op);
          all = CpGatherOp::create(
              b, op.getLoc(),
              RankedTensorType::get({rows, t.getDimSize(1)},
                                    t.getElementType()),
              use.get(), b.getI64IntegerAttr(cp), b.getI64IntegerAttr(seq));
          gathered.insert(all);
        }
        use.set(all);
      }
      for (Value r : op.getResults())
        gathered.insert(r);
      continue;
    }
    if (failed(splitGathered(op)))
      return failure();
    if (auto attn = dyn_cast<AttentionOp>(op)) {
      if (int64_t(attn.getSeq()) != seq)
        return fail(&op) << "attention over sequences of " << attn.getSeq()
                         << " tokens, but the batch's are " << seq;
      if (d.get<ContextParallelOptions>().kind ==
          ContextParallelKind::Ulysses) {
        FailureOr<Value> y = ulysses(attn);
        if (failed(y))
          return failure();
        sharded.insert(*y);
        continue;
      }
      OpBuilder b(&op);
      int64_t heads = attn.getHeads();
      auto yType = part(attn.getResult().getType());
      // The log-sum-exp as a (bf16, rest) pair per head (PiperCpOps.td).
      auto lseType = RankedTensorType::get({yType.getDimSize(0), 2 * heads},
                                           b.getF32Type());
      auto ring = CpAttentionOp::create(
          b, op.getLoc(), yType, lseType, attn.getQkv(), attn.getHeadsAttr(),
          attn.getSeqAttr(), attn.getKvHeadsAttr(), attn.getRopeThetaAttr(),
          b.getI64IntegerAttr(cp), attn.getRopeScalingAttr());
      for (NamedAttribute a : op.getDiscardableAttrs())
        ring->setDiscardableAttr(a.getName(), a.getValue());
      attn.getResult().replaceAllUsesWith(ring.getResult());
      attn.getLse().replaceAllUsesWith(ring.getLse());
      op.erase();
      sharded.insert(ring.getResult());
      sharded.insert(ring.getLse());
      continue;
    }
    if (auto pos = dyn_cast<PositionAddOp>(op)) {
      if (int64_t(pos.getSeq()) != seq)
        return fail(&op) << "position embeddings of sequences of "
                         << pos.getSeq() << " tokens, but the batch's are "
                         << seq;
      // Each local row adds its global position.
      pos.setCpAttr(OpBuilder(&op).getI64IntegerAttr(cp));
    }
    // Under tensor parallelism (shard_tensor ran first): Megatron's f and
    // g, the vocabulary-parallel loss and sequence parallelism's row
    // splits and gathers, which then split the member's rows.
    if (isa<SpSplitOp, SpGatherOp, SpAllGatherOp, SpReduceScatterOp>(op) &&
        (rows / cp) % tp != 0)
      return fail(&op) << "sequence parallelism splits each member's "
                       << rows / cp << " rows (B S / cp) over " << tp
                       << " tensor-parallel members, which does not divide "
                          "them";
    if (!isa<EmbeddingOp, PositionAddOp, RmsNormOp, QkNormOp, LayerNormOp,
             LinearOp, AddOp, BiasAddOp, GeluOp, SwigluOp, CrossEntropyOp,
             TpCopyOp, TpReduceOp, VocabCeStatsOp, VocabCrossEntropyOp,
             SpSplitOp, SpGatherOp, SpAllGatherOp, SpReduceScatterOp>(op))
      return fail(&op) << op.getName()
                       << " reads the sequence's rows, and context "
                          "parallelism does not know how to split it";
    for (Value r : op.getResults()) {
      auto t = cast<RankedTensorType>(r.getType());
      if (t.getRank() == 0)
        continue;
      // A row per token, or under sequence parallelism the tensor
      // member's rows.
      if (t.getRank() != 2 ||
          (t.getDimSize(0) != rows && t.getDimSize(0) * tp != rows))
        return fail(&op) << op.getName() << " gives " << t
                         << ", which is not a row per token (" << rows
                         << " rows)";
      r.setType(part(t));
      sharded.insert(r);
    }
  }
  // What leaves the segment of an MoE layer's whole sequence leaves as the
  // member's rows.
  return splitGathered(*body.getTerminator());
}

LogicalResult ContextParallel::run(ProgramOp program) {
  MLIRContext *ctx = module.getContext();
  if (getMesh(module).getCp() > 1)
    return fail(program) << "the model is already split by a "
                            "context_parallel directive";
  tp = getMesh(module).getTp();
  Block &top = program.getBody().front();
  auto batches = top.getOps<BatchOp>();
  if (!llvm::hasSingleElement(batches))
    return fail(program) << "needs the forward model's one piper.batch "
                            "(run it before split)";
  BatchOp batch = *batches.begin();
  auto ids = cast<RankedTensorType>(batch.getTokens().getType());
  seq = ids.getDimSize(1);
  rows = ids.getDimSize(0) * seq;
  if (seq % (2 * cp) != 0)
    return fail(batch) << "the sequence of " << seq
                       << " tokens is not a multiple of 2 * cp = " << 2 * cp
                       << " (each member holds two of 2 * cp equal chunks)";
  bool attention = false;
  module.walk([&](AttentionOp) { attention = true; });
  if (!attention)
    return fail(program) << "the model has no attention: context "
                            "parallelism splits attention's sequence";
  llvm::DenseMap<SegmentOp, int> callers;
  for (TaskOp t : top.getOps<TaskOp>())
    ++callers[symbols.lookup<SegmentOp>(t.getSegment())];
  auto local = RankedTensorType::get({ids.getDimSize(0), seq / cp},
                                     ids.getElementType());
  llvm::DenseSet<Value> sharded;
  for (Value v : {batch.getTokens(), batch.getTargets()}) {
    v.setType(local);
    sharded.insert(v);
  }
  for (TaskOp t : top.getOps<TaskOp>()) {
    auto seg = symbols.lookup<SegmentOp>(t.getSegment());
    if (!seg)
      return t.emitOpError("calls unknown segment @") << t.getSegment();
    Block &body = seg.getBody().front();
    llvm::DenseSet<Value> inside;
    bool any = false;
    for (auto [i, arg] : llvm::enumerate(t.getArgs())) {
      if (!sharded.contains(arg))
        continue;
      body.getArgument(i).setType(arg.getType());
      inside.insert(body.getArgument(i));
      any = true;
    }
    if (!any)
      continue;
    if (callers.lookup(seg) != 1)
      return fail(t) << "segment @" << seg.getSymName()
                     << " is called by more than one task";
    if (failed(rewrite(seg, inside)))
      return failure();
    auto yield = cast<YieldOp>(body.getTerminator());
    SmallVector<Type> results;
    for (auto [j, v] : llvm::enumerate(yield.getValues())) {
      results.push_back(v.getType());
      t.getOuts()[j].setType(v.getType());
      if (inside.contains(v))
        sharded.insert(t.getOuts()[j]);
    }
    seg.setFunctionTypeAttr(TypeAttr::get(
        FunctionType::get(ctx, body.getArgumentTypes(), results)));
  }
  const auto &o = d.get<ContextParallelOptions>();
  setContextParallel(module, cp, o.stream, o.overlap);
  return success();
}

LogicalResult mlir::piper::applyContextParallel(ModuleOp module,
                                                ProgramOp program,
                                                const Directive &d) {
  return ContextParallel(module, d).run(program);
}
