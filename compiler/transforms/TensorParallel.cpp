// Tensor parallelism (docs/tensor-parallel.md). The `shard_tensor`
// directive rewrites the forward model, Megatron's way: in each selected
// block, the linear before an attention, SwiGLU or GELU core is split by
// columns (its output features: whole heads, or whole gate|up pairs) and the
// linear after it by rows, so that each member of a tensor-parallel group
// computes its share of the core with no communication. Megatron's f
// (`piper.tp_copy`, before the column-parallel linear) and g
// (`piper.tp_reduce`, after the row-parallel one, whose bias a
// `piper.bias_add` then adds once) carry the collectives;
// autodiff derives the backward's from their gradient rules. After
// placement, piper-tensor-parallel makes every tp_reduce a value all-reduce
// over the tensor-parallel groups of its task's devices.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "mlir/IR/Builders.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERTENSORPARALLEL
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

namespace {

/// One tensor-parallel layer of a block: the column-parallel linear, the
/// core between (attention, swiglu or gelu) and the row-parallel linear.
struct TpLayer {
  LinearOp column;
  Operation *core;
  LinearOp row;
  /// The fused parts of the column linear's output features (q, k, v;
  /// gate, up), or empty for one.
  SmallVector<int64_t> parts;
  /// Attention with fewer key/value heads K than members T: the T / K
  /// members sharing each key/value head (1: heads split).
  int64_t kvShare = 1;
};

/// How one parameter is sliced.
struct Slice {
  int64_t dim;
  SmallVector<int64_t> parts;
};

RankedTensorType withDim(Type t, int64_t dim, int64_t size) {
  auto r = cast<RankedTensorType>(t);
  SmallVector<int64_t> shape(r.getShape());
  shape[dim] = size;
  return RankedTensorType::get(shape, r.getElementType());
}

int64_t dimOf(Value v, int64_t dim) {
  return cast<RankedTensorType>(v.getType()).getDimSize(dim);
}

class ShardTensor {
public:
  ShardTensor(ModuleOp module, const Directive &d)
      : module(module), d(d), tp(d.tensorParallel), symbols(module) {}

  /// Why `core` (reading `in`, the column linear's output, and giving
  /// `out`) cannot be split, or its layer.
  FailureOr<TpLayer> match(Operation *core, Value in, Value out,
                           int64_t block) {
    auto fail = [&]() {
      return core->emitOpError(d.describe())
             << ": block " << block << "'s " << core->getName() << " ";
    };
    TpLayer layer;
    layer.core = core;
    layer.column = in.getDefiningOp<LinearOp>();
    if (!layer.column || !layer.column.getWeight().getDefiningOp<ParamRefOp>() ||
        layer.column.getTransposeW() || !in.hasOneUse())
      return fail() << "does not read a linear layer of its own (the "
                       "column-parallel half of a tensor-parallel layer)";
    if (!out.hasOneUse())
      return fail() << "has more than one reader; tensor parallelism needs "
                       "one linear layer after it (the row-parallel half)";
    layer.row = dyn_cast<LinearOp>(*out.getUsers().begin());
    if (!layer.row || layer.row.getInput() != out ||
        !layer.row.getWeight().getDefiningOp<ParamRefOp>() ||
        layer.row.getTransposeW())
      return fail() << "is not read by a linear layer (the row-parallel "
                       "half of a tensor-parallel layer)";
    if (auto attn = dyn_cast<AttentionOp>(core)) {
      int64_t heads = attn.getHeads(), kv = attn.getNumKvHeads();
      int64_t hd = dimOf(out, 1) / heads;
      if (heads % tp != 0)
        return fail() << "has " << heads
                      << " heads, which tensor parallelism of " << tp
                      << " does not divide";
      if (kv % tp != 0 && tp % kv != 0)
        return fail() << "has " << kv << " key/value heads, which tensor "
                      << "parallelism of " << tp
                      << " neither divides nor is a multiple of (each "
                         "member needs whole key/value heads, or the same "
                         "number of members must share each)";
      if (kv < tp) {
        // Replicated key/value heads (docs/tensor-parallel.md §2b).
        layer.kvShare = tp / kv;
        if (hd % layer.kvShare != 0)
          return fail() << "has a head dimension of " << hd
                        << ", which the " << layer.kvShare
                        << " members sharing each of its " << kv
                        << " key/value heads do not divide";
        if (layer.column.getBias())
          return fail() << "has a bias on its q|k|v projection, which "
                           "replicated key/value heads ("
                        << kv << " key/value heads over tensor parallelism of "
                        << tp
                        << ") do not support";
      }
      layer.parts = {heads * hd, kv * hd, kv * hd};
    } else if (isa<SwigluOp>(core)) {
      int64_t ffn = dimOf(out, 1);
      if (ffn % tp != 0)
        return fail() << "has " << ffn << " hidden features, which tensor "
                      << "parallelism of " << tp << " does not divide";
      layer.parts = {ffn, ffn};
    } else {
      int64_t ffn = dimOf(out, 1);
      if (ffn % tp != 0)
        return fail() << "has " << ffn << " hidden features, which tensor "
                      << "parallelism of " << tp << " does not divide";
    }
    return layer;
  }

  /// The layers of `seg`, in op order.
  FailureOr<SmallVector<TpLayer>> layersOf(SegmentOp seg, int64_t block) {
    SmallVector<TpLayer> layers;
    for (Operation &op : seg.getBody().front().without_terminator()) {
      Value in, out;
      if (auto a = dyn_cast<AttentionOp>(op))
        in = a.getQkv(), out = a.getResult();
      else if (auto s = dyn_cast<SwigluOp>(op))
        in = s.getInput(), out = s.getResult();
      else if (auto g = dyn_cast<GeluOp>(op))
        in = g.getInput(), out = g.getResult();
      else
        continue;
      // An MoE layer's experts (expert_linear) stay whole on every member.
      if (in.getDefiningOp<ExpertLinearOp>())
        continue;
      FailureOr<TpLayer> layer = match(&op, in, out, block);
      if (failed(layer))
        return failure();
      layers.push_back(*layer);
    }
    return layers;
  }

  LogicalResult addSlice(Value weight, Slice s, Operation *at) {
    auto ref = weight.getDefiningOp<ParamRefOp>();
    StringAttr name = ref.getParamAttr().getAttr();
    auto it = slices.find(name);
    if (it != slices.end() &&
        (it->second.dim != s.dim || it->second.parts != s.parts))
      return at->emitOpError(d.describe())
             << ": parameter @" << name.getValue()
             << " would be split two different ways";
    slices[name] = std::move(s);
    return success();
  }

  /// Splits one layer: local types, local heads, f before and g after.
  LogicalResult rewrite(TpLayer &layer) {
    LinearOp col = layer.column, row = layer.row;
    Value colOut = col.getResult();
    int64_t features = dimOf(colOut, 1);
    if (failed(addSlice(col.getWeight(), Slice{1, layer.parts}, col)) ||
        (col.getBias() &&
         failed(addSlice(col.getBias(), Slice{0, layer.parts}, col))) ||
        failed(addSlice(row.getWeight(), Slice{0, {}}, row)))
      return failure();
    if (col.getBias() && !col.getBias().getDefiningOp<ParamRefOp>())
      return col.emitOpError(d.describe())
             << ": the bias of a column-parallel linear layer must be a "
                "parameter";
    OpBuilder b(col);
    Value copy = TpCopyOp::create(b, col.getLoc(), col.getInput());
    col.getInputMutable().assign(copy);
    colOut.setType(withDim(colOut.getType(), 1, features / tp));
    Value coreOut = layer.core->getResult(0);
    coreOut.setType(withDim(coreOut.getType(), 1, dimOf(coreOut, 1) / tp));
    if (auto attn = dyn_cast<AttentionOp>(layer.core)) {
      int64_t kv = attn.getNumKvHeads();
      attn.setHeads(attn.getHeads() / tp);
      attn.setKvHeads(std::max<int64_t>(kv / tp, 1));
      if (layer.kvShare > 1)
        replicateKvHead(layer);
    }
    // The row layer's bias is added once, after the sum.
    b.setInsertionPointAfter(row);
    Value bias = row.getBias();
    if (bias)
      row.getBiasMutable().clear();
    auto sum = TpReduceOp::create(b, row.getLoc(), row.getResult());
    Value out = sum;
    if (bias)
      out = BiasAddOp::create(b, row.getLoc(), sum.getType(), sum, bias);
    row.getResult().replaceAllUsesExcept(out, sum);
    rewritten.insert(col);
    rewritten.insert(row);
    return success();
  }

  /// Replicated key/value heads (docs/tensor-parallel.md §2b): the weight
  /// stays sliced T ways (member m holds 1/r of head m / r's k and v
  /// columns), and before the GEMM each member gathers the pieces and
  /// assembles its head whole, so the column linear computes q for its
  /// heads and k, v for the one head they read.
  void replicateKvHead(TpLayer &layer) {
    LinearOp col = layer.column;
    Value weight = col.getWeight();
    auto global = cast<RankedTensorType>(weight.getType());
    int64_t rows = global.getDimSize(0);
    int64_t query = layer.parts[0] / tp, piece = layer.parts[1] / tp;
    int64_t hd = piece * layer.kvShare;
    Type f32 = global.getElementType();
    MLIRContext *ctx = module.getContext();
    OpBuilder b(col);
    Location loc = col.getLoc();
    auto i64 = [&](int64_t v) {
      return IntegerAttr::get(IntegerType::get(ctx, 64), v);
    };
    // The param_ref's type becomes local in sliceParams; these are built
    // with the local shapes already.
    auto pieces = ColumnsOp::create(
        b, loc, RankedTensorType::get({rows, 2 * piece}, f32), weight,
        i64(query));
    auto all = SpAllGatherOp::create(
        b, loc, RankedTensorType::get({tp * rows, 2 * piece}, f32), pieces,
        i64(tp));
    auto assembled = TpKvAssembleOp::create(
        b, loc, RankedTensorType::get({rows, query + 2 * hd}, f32), weight,
        all, i64(tp), i64(query));
    col.getWeightMutable().assign(assembled);
    col.getResult().setType(
        withDim(col.getResult().getType(), 1, query + 2 * hd));
    rewritten.insert(pieces);
    rewritten.insert(assembled);
  }

  /// Makes every split parameter local, with its slice, and its reads.
  LogicalResult sliceParams() {
    MLIRContext *ctx = module.getContext();
    for (auto &[name, s] : slices) {
      auto param = symbols.lookup<ParamOp>(name);
      if (param.getExpertMembers() || param.getTensorSliceAttr())
        return param.emitOpError(d.describe())
               << ": @" << name.getValue() << " is already split";
      int64_t extent = param.getTensorType().getDimSize(s.dim);
      if (extent % tp != 0)
        return param.emitOpError(d.describe())
               << ": dimension " << s.dim << " of @" << name.getValue()
               << " (" << extent << ") is not divisible by tensor "
               << "parallelism of " << tp;
      param.setType(withDim(param.getType(), s.dim, extent / tp));
      param.setTensorSliceAttr(TensorSliceAttr::get(ctx, s.dim, tp, s.parts));
    }
    WalkResult walk = module.walk([&](ParamRefOp ref) {
      auto it = slices.find(ref.getParamAttr().getAttr());
      if (it == slices.end())
        return WalkResult::advance();
      for (Operation *user : ref->getUsers())
        if (!rewritten.contains(user)) {
          ref.emitOpError(d.describe())
              << ": @" << it->first.getValue()
              << " is split by tensor parallelism, but also read by "
              << user->getName()
              << " outside the tensor-parallel layers";
          return WalkResult::interrupt();
        }
      ref.getResult().setType(
          symbols.lookup<ParamOp>(it->first).getType());
      return WalkResult::advance();
    });
    return failure(walk.wasInterrupted());
  }

  LogicalResult run(ProgramOp program) {
    auto fail = [&](Operation *at) {
      return at->emitOpError(d.describe()) << ": ";
    };
    if (getTensorParallel(module) > 1)
      return fail(program) << "the model is already split by tensor "
                              "parallelism of "
                           << getTensorParallel(module);
    std::optional<int64_t> wanted;
    if (auto it = d.filter.entries.find("block");
        it != d.filter.entries.end() && it->second.kind == FilterValue::Index)
      wanted = it->second.index;
    SmallVector<TaskOp> tasks(program.getBody().front().getOps<TaskOp>());
    llvm::MapVector<SegmentOp, int64_t> segments;
    int64_t lastBlock = -1;
    for (TaskOp t : tasks) {
      TagAttr tag = t.getTag();
      if (!tag.getBlock() || tag.getPp() || tag.getPass().has_value())
        return fail(t) << "shard_tensor rewrites the forward model before "
                          "stage and autodiff, but "
                       << describeNode(t)
                       << " is already staged (expected tasks tagged with "
                          "'block' only)";
      lastBlock = std::max(lastBlock, *tag.getBlock());
      if (wanted && *tag.getBlock() != *wanted)
        continue;
      auto seg = symbols.lookup<SegmentOp>(t.getSegment());
      if (!seg)
        return fail(t) << describeNode(t) << " calls unknown segment @"
                       << t.getSegment();
      segments.insert({seg, *tag.getBlock()});
    }
    if (wanted && segments.empty())
      return fail(program) << "the model has no block " << *wanted
                           << " (its blocks are 0 to " << lastBlock << ")";
    int layers = 0;
    // The blocks with a tensor-parallel layer: sequence parallelism's.
    llvm::MapVector<SegmentOp, int64_t> split;
    for (auto [seg, block] : segments) {
      FailureOr<SmallVector<TpLayer>> found = layersOf(seg, block);
      if (failed(found))
        return failure();
      if (wanted && found->empty())
        return fail(seg) << "block " << block
                         << " has no attention or MLP to split";
      for (TpLayer &layer : *found)
        if (failed(rewrite(layer)))
          return failure();
      layers += found->size();
      if (!found->empty())
        split.insert({seg, block});
    }
    if (layers == 0)
      return fail(program) << "the model has no transformer block (an "
                              "attention or MLP) to split";
    if (d.vocabParallel && failed(vocabParallel(program)))
      return failure();
    if (failed(sliceParams()))
      return failure();
    if (d.sequenceParallel && failed(sequenceParallel(program, split)))
      return failure();
    setTensorParallel(module, tp, d.stream);
    return success();
  }

  /// Why the vocabulary of `vocab` tokens cannot be split, or success.
  LogicalResult checkVocab(Operation *at, StringRef what, int64_t vocab) {
    if (vocab % tp == 0)
      return success();
    return at->emitOpError(d.describe())
           << ": vocabulary parallelism: " << what << " has a vocabulary of "
           << vocab << " tokens, which tensor parallelism of " << tp
           << " does not divide (pad the vocabulary to a multiple of " << tp
           << ", or keep the embedding and LM head whole with "
              "\"vocab_parallel\": false, --no-vocab-parallel)";
  }

  /// Vocabulary parallelism (Megatron's vocab-parallel embedding and cross
  /// entropy), over every segment whatever the filter: each token embedding
  /// table and each LM head (the linear layer whose logits a cross entropy
  /// reads) split by vocabulary rows. An embedding gives zero rows for
  /// other members' ids and a g (`piper.tp_reduce`) sums them; the head
  /// reads its input through f (`piper.tp_copy`), and its member's logits
  /// go to `piper.vocab_ce_stats`, whose per-row statistics g sums before
  /// `piper.vocab_cross_entropy`: the logits are never gathered. A head
  /// tied to the embedding (`transpose_w` on the table) takes the same
  /// rows.
  LogicalResult vocabParallel(ProgramOp program) {
    MLIRContext *ctx = module.getContext();
    IntegerAttr members = IntegerAttr::get(IntegerType::get(ctx, 64), tp);
    llvm::SmallPtrSet<Operation *, 8> seen;
    auto fail = [&](Operation *at) {
      return at->emitOpError(d.describe()) << ": vocabulary parallelism: ";
    };
    for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
      auto seg = symbols.lookup<SegmentOp>(t.getSegment());
      if (!seg || !seen.insert(seg).second)
        continue;
      for (Operation &op : llvm::make_early_inc_range(
               seg.getBody().front().without_terminator())) {
        if (auto emb = dyn_cast<EmbeddingOp>(op)) {
          if (!emb.getTable().getDefiningOp<ParamRefOp>())
            return fail(emb) << "the embedding's table is not a parameter";
          if (failed(checkVocab(emb, "the token embedding",
                                dimOf(emb.getTable(), 0))) ||
              failed(addSlice(emb.getTable(), Slice{0, {}}, emb)))
            return failure();
          emb.setMembersAttr(members);
          OpBuilder b(ctx);
          b.setInsertionPointAfter(emb);
          auto sum = TpReduceOp::create(b, emb.getLoc(), emb.getResult());
          emb.getResult().replaceAllUsesExcept(sum, sum);
          rewritten.insert(emb);
          continue;
        }
        auto ce = dyn_cast<CrossEntropyOp>(op);
        if (!ce)
          continue;
        Value logits = ce.getLogits();
        auto head = logits.getDefiningOp<LinearOp>();
        if (!head || !head.getWeight().getDefiningOp<ParamRefOp>() ||
            !logits.hasOneUse())
          return fail(ce) << "the loss's logits are not computed by a "
                             "linear layer of their own (the LM head)";
        int64_t vocab = dimOf(logits, 1);
        if (failed(checkVocab(ce, "the LM head", vocab)) ||
            failed(addSlice(head.getWeight(),
                            Slice{head.getTransposeW() ? 0 : 1, {}}, head)))
          return failure();
        if (Value bias = head.getBias()) {
          if (!bias.getDefiningOp<ParamRefOp>())
            return fail(head) << "the LM head's bias is not a parameter";
          if (failed(addSlice(bias, Slice{0, {}}, head)))
            return failure();
        }
        OpBuilder b(head);
        Value copy = TpCopyOp::create(b, head.getLoc(), head.getInput());
        head.getInputMutable().assign(copy);
        logits.setType(withDim(logits.getType(), 1, vocab / tp));
        b.setInsertionPoint(ce);
        int64_t rows = dimOf(logits, 0);
        auto stats = VocabCeStatsOp::create(
            b, ce.getLoc(),
            RankedTensorType::get({rows, 4 * tp + 1}, b.getF32Type()), logits,
            ce.getTargets(), members);
        auto sum = TpReduceOp::create(b, ce.getLoc(), stats.getResult());
        auto loss = VocabCrossEntropyOp::create(b, ce.getLoc(), ce.getType(),
                                                sum, logits, ce.getTargets(),
                                                members);
        ce.getLoss().replaceAllUsesWith(loss.getLoss());
        ce.erase();
        rewritten.insert(head);
      }
    }
    return success();
  }

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
  LogicalResult sequenceParallel(
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
      return r && r.getRank() == 2 && r.getElementType().isF32()
                 ? r.getDimSize(0)
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
        auto split = SpSplitOp::create(b, seg.getLoc(), part(arg.getType()),
                                       arg, members);
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
          auto ag = SpAllGatherOp::create(
              b, op.getLoc(), whole(copy.getInput().getType()),
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
          auto rs = SpReduceScatterOp::create(
              b, op.getLoc(), part(reduce.getInput().getType()),
              reduce.getInput(), members);
          reduce.getResult().replaceAllUsesWith(rs.getResult());
          op.erase();
          sharded.insert(rs.getResult());
          continue;
        }
        if (isa<SpSplitOp>(op))
          continue;
        bool reads = llvm::any_of(op.getOperands(), [&](Value v) {
          return sharded.contains(v);
        });
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
                   << v.getType() << ", whose rows tensor parallelism of "
                   << tp << " does not divide";
          use.set(SpSplitOp::create(b, op.getLoc(), part(v.getType()), v,
                                    members));
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
          auto g = SpGatherOp::create(b, yield.getLoc(), whole(v.getType()),
                                      v, members);
          yield->setOperand(j, g.getResult());
        } else if (want && !have) {
          if (rowsOf(v.getType()) % tp != 0)
            return fail(yield, block)
                   << "result " << j << " has rows tensor parallelism of "
                   << tp << " does not divide";
          auto sp = SpSplitOp::create(b, yield.getLoc(), part(v.getType()),
                                      v, members);
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

private:
  ModuleOp module;
  const Directive &d;
  int64_t tp;
  SymbolTable symbols;
  llvm::MapVector<StringAttr, Slice> slices;
  llvm::SmallPtrSet<Operation *, 16> rewritten;
};

} // namespace

LogicalResult mlir::piper::applyShardTensor(ModuleOp module, ProgramOp program,
                                            const Directive &d) {
  return ShardTensor(module, d).run(program);
}

/// The markers that become collectives over the tensor-parallel group: g
/// (an all-reduce) and sequence parallelism's all-gathers and
/// reduce-scatters (sp_split stays a kernel: it needs no communication).
static bool isCollectiveMarker(Operation &op) {
  return isa<TpReduceOp, SpAllGatherOp, SpReduceScatterOp, SpGatherOp>(op);
}

/// The marker a piece of splitAround holds alone, or null.
static Operation *soleMarker(SegmentOp piece) {
  if (Operation *op = soleOp<TpReduceOp>(piece))
    return op;
  if (Operation *op = soleOp<SpAllGatherOp>(piece))
    return op;
  if (Operation *op = soleOp<SpReduceScatterOp>(piece))
    return op;
  return soleOp<SpGatherOp>(piece);
}

/// Moves each accumulate_grad of `seg` up to just after the op that
/// computes its gradient (the block's start for an argument), but never
/// before an earlier accumulation of the same parameter (so each
/// accumulator adds in the same order). A column layer's weight gradient is
/// computed before its input gradient's all-reduce, but autodiff
/// accumulates it after; cut there, one piece would hand the next a weight
/// gradient, and once a split backward divides the pieces into BI and BW
/// (zero-bubble schedules), or ZeRO hands each piece's gradients to a
/// reduce-scatter, the next piece's BI would read this piece's BW.
static void hoistAccumulations(SegmentOp seg) {
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

/// Moves each collective marker on a weight gradient's path (the gathered
/// key/value pieces' reduce-scatter, docs/tensor-parallel.md §2b), with
/// everything that reads it, to the end of the segment, in order. Input
/// gradients never read weight gradients, so this keeps the dataflow; cut
/// there, no input-gradient op comes after such a collective, and a split
/// backward (zero-bubble schedules) defers it with the weight gradients
/// instead of making the next piece's BI wait for this piece's BW.
static void sinkWeightGradientMarkers(SegmentOp seg) {
  DenseMap<Operation *, unsigned> weight = weightGradientOps(seg);
  Block &body = seg.getBody().front();
  llvm::SmallPtrSet<Operation *, 16> moved;
  SmallVector<Operation *> order;
  for (Operation &op : body.without_terminator()) {
    bool sink = isCollectiveMarker(op) && weight.lookup(&op) == 1;
    for (Value v : op.getOperands())
      if (Operation *def = v.getDefiningOp(); def && moved.contains(def))
        sink = true;
    if (sink) {
      moved.insert(&op);
      order.push_back(&op);
    }
  }
  for (Operation *op : order)
    op->moveBefore(body.getTerminator());
}

LogicalResult mlir::piper::lowerTensorParallel(ModuleOp module) {
  int64_t tp = getTensorParallel(module);
  if (tp < 2) {
    WalkResult stray = module.walk([](Operation *op) {
      if (!isa<TpCopyOp, TpReduceOp, SpAllGatherOp, SpReduceScatterOp,
               SpSplitOp, SpGatherOp>(op))
        return WalkResult::advance();
      op->emitOpError("needs the module's tensor-parallel degree "
                      "(piper.tensor_parallel, set by shard_tensor)");
      return WalkResult::interrupt();
    });
    return failure(stray.wasInterrupted());
  }
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  // f is the identity forward: autodiff has read its gradient rule.
  module.walk([](TpCopyOp copy) {
    copy.getResult().replaceAllUsesWith(copy.getInput());
    copy.erase();
  });
  MLIRContext *ctx = module.getContext();
  StreamAttr stream =
      commStream(*program, getTensorParallelStream(module));
  SymbolTable symbols(module);
  llvm::MapVector<StringAttr, SegmentPieces> piecesOf;
  SmallVector<std::pair<TaskOp, ArrayAttr>> tasks;
  for (TaskOp t : program->getBody().front().getOps<TaskOp>()) {
    auto seg = symbols.lookup<SegmentOp>(t.getSegment());
    if (!seg || llvm::none_of(seg.getBody().front(), isCollectiveMarker))
      continue;
    ArrayRef<int64_t> devices =
        t.getDevices() ? t.getNodeDevices() : ArrayRef<int64_t>();
    if (devices.empty() || devices.size() % tp != 0)
      return t.emitOpError()
             << describeNode(t) << " runs on "
             << (devices.empty() ? std::string("no device")
                                 : formatDevices(devices))
             << ", which is not made of whole tensor-parallel groups of " << tp
             << "; place its stage on a multiple of " << tp << " devices";
    SmallVector<Attribute> chunks;
    for (size_t first = 0; first < devices.size(); first += tp)
      chunks.push_back(
          DeviceGroupAttr::get(ctx, devices.slice(first, tp)));
    tasks.push_back({t, ArrayAttr::get(ctx, chunks)});
    StringAttr name = t.getSegmentAttr().getAttr();
    if (piecesOf.count(name))
      continue;
    hoistAccumulations(seg);
    sinkWeightGradientMarkers(seg);
    FailureOr<SegmentPieces> pieces =
        splitAround(seg, isCollectiveMarker, symbols);
    if (failed(pieces))
      return failure();
    piecesOf[name] = std::move(*pieces);
  }
  for (auto [t, chunks] : tasks) {
    const SegmentPieces &pieces = piecesOf[t.getSegmentAttr().getAttr()];
    splitTaskWith(
        t, pieces,
        [&](OpBuilder &b, unsigned j, ArrayRef<Value> args,
            ArrayRef<Value> deps) -> std::optional<PieceNode> {
          Operation *marker = soleMarker(pieces.pieces[j]);
          if (!marker)
            return std::nullopt;
          Type type = marker->getResult(0).getType();
          Operation *node;
          Value result, done;
          if (isa<TpReduceOp>(marker)) {
            auto ar = AllReduceOp::create(b, t.getLoc(), ValueRange{args[0]},
                                          deps, t.getDevicesAttr(), stream,
                                          t.getTag());
            node = ar, result = ar.getResults()[0], done = ar.getDone();
          } else if (isa<SpReduceScatterOp>(marker)) {
            auto rs = ReduceScatterOp::create(
                b, t.getLoc(), type, b.getType<TokenType>(), args[0], deps,
                t.getDevicesAttr(), stream, t.getTag(), IntegerAttr(),
                ArrayAttr());
            node = rs, result = rs.getResult(), done = rs.getDone();
          } else {
            auto ag = AllGatherOp::create(
                b, t.getLoc(), type, b.getType<TokenType>(), args[0], deps,
                t.getDevicesAttr(), stream, t.getTag(), IntegerAttr(),
                ArrayAttr());
            node = ag, result = ag.getResult(), done = ag.getDone();
          }
          if (chunks.size() > 1)
            node->setAttr("subgroups", chunks);
          return PieceNode{node, {result}, done};
        });
  }
  for (auto &entry : piecesOf) {
    for (SegmentOp piece : entry.second.pieces)
      if (soleMarker(piece))
        symbols.erase(piece);
    symbols.erase(symbols.lookup<SegmentOp>(entry.first));
  }
  return sortTopologically(program->getBody().front());
}

namespace {
struct TensorParallelPass
    : mlir::piper::impl::PiperTensorParallelBase<TensorParallelPass> {
  void runOnOperation() override {
    if (failed(lowerTensorParallel(getOperation())))
      signalPassFailure();
  }
};
} // namespace
