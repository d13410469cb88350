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
// placement, piper-lower-segment-collectives (SegmentCollectives.cpp)
// makes every tp_reduce a value all-reduce over the tensor-parallel groups
// of its task's devices. Vocabulary
// and sequence parallelism are VocabParallel.cpp and SequenceParallel.cpp.
#include "compiler/transforms/ShardTensor.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::piper;

namespace mlir::piper::tensor_parallel {

/// Why `core` (reading `in`, the column linear's output, and giving
/// `out`) cannot be split, or its layer.
FailureOr<TpLayer> ShardTensor::match(Operation *core, Value in, Value out,
                                      int64_t block) {
  auto fail = [&]() {
    return core->emitOpError(d.describe())
           << ": block " << block << "'s " << core->getName() << " ";
  };
  TpLayer layer;
  layer.core = core;
  // Attention may read q|k|v through Qwen3's q/k norm, on whole heads.
  if (auto norm = in.getDefiningOp<QkNormOp>();
      norm && isa<AttentionOp>(core)) {
    if (!in.hasOneUse())
      return fail() << "reads a q/k norm that has other readers";
    layer.qkNorm = norm;
    in = norm.getQkv();
  }
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
      return fail() << "has " << heads << " heads, which tensor parallelism of "
                    << tp << " does not divide";
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
        return fail() << "has a head dimension of " << hd << ", which the "
                      << layer.kvShare << " members sharing each of its " << kv
                      << " key/value heads do not divide";
      if (layer.column.getBias())
        return fail() << "has a bias on its q|k|v projection, which "
                         "replicated key/value heads ("
                      << kv << " key/value heads over tensor parallelism of "
                      << tp << ") do not support";
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
FailureOr<SmallVector<TpLayer>> ShardTensor::layersOf(SegmentOp seg,
                                                      int64_t block) {
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

LogicalResult ShardTensor::addSlice(Value weight, Slice s, Operation *at) {
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
LogicalResult ShardTensor::rewrite(TpLayer &layer) {
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
    attn.getLse().setType(
        withDim(attn.getLse().getType(), 1, 2 * attn.getHeads()));
    if (layer.kvShare > 1)
      replicateKvHead(layer);
    if (QkNormOp norm = layer.qkNorm) {
      // The norm's weight is whole on every member, which normalizes its
      // own heads: its gradient is a sum over the group.
      norm.setHeads(attn.getHeads());
      norm.setKvHeads(attn.getNumKvHeads());
      norm.getResult().setType(col.getResult().getType());
      auto ref = norm.getGamma().getDefiningOp<ParamRefOp>();
      if (!ref)
        return norm.emitOpError(d.describe())
               << ": the q/k norm's weight must be a parameter";
      setSequencePartial(symbols.lookup<ParamOp>(ref.getParamAttr().getAttr()));
    }
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
void ShardTensor::replicateKvHead(TpLayer &layer) {
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
  auto pieces =
      ColumnsOp::create(b, loc, RankedTensorType::get({rows, 2 * piece}, f32),
                        weight, i64(query));
  auto all = SpAllGatherOp::create(
      b, loc, RankedTensorType::get({tp * rows, 2 * piece}, f32), pieces,
      i64(tp));
  auto assembled = TpKvAssembleOp::create(
      b, loc, RankedTensorType::get({rows, query + 2 * hd}, f32), weight, all,
      i64(tp), i64(query));
  col.getWeightMutable().assign(assembled);
  col.getResult().setType(
      withDim(col.getResult().getType(), 1, query + 2 * hd));
  rewritten.insert(pieces);
  rewritten.insert(assembled);
}

/// Makes every split parameter local, with its slice, and its reads.
LogicalResult ShardTensor::sliceParams() {
  MLIRContext *ctx = module.getContext();
  for (auto &[name, s] : slices) {
    auto param = symbols.lookup<ParamOp>(name);
    if (param.getExpertMembers() || param.getTensorSliceAttr())
      return param.emitOpError(d.describe())
             << ": @" << name.getValue() << " is already split";
    int64_t extent = param.getTensorType().getDimSize(s.dim);
    if (extent % tp != 0)
      return param.emitOpError(d.describe())
             << ": dimension " << s.dim << " of @" << name.getValue() << " ("
             << extent << ") is not divisible by tensor "
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
            << user->getName() << " outside the tensor-parallel layers";
        return WalkResult::interrupt();
      }
    ref.getResult().setType(symbols.lookup<ParamOp>(it->first).getType());
    return WalkResult::advance();
  });
  return failure(walk.wasInterrupted());
}

LogicalResult ShardTensor::run(ProgramOp program) {
  auto fail = [&](Operation *at) {
    return at->emitOpError(d.describe()) << ": ";
  };
  if (getMesh(module).getTp() > 1)
    return fail(program) << "the model is already split by tensor "
                            "parallelism of "
                         << getMesh(module).getTp();
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
  const auto &o = d.get<ShardTensorOptions>();
  if (o.vocabParallel && failed(vocabParallel(program)))
    return failure();
  if (failed(sliceParams()))
    return failure();
  if (o.sequenceParallel && failed(sequenceParallel(program, split)))
    return failure();
  setTensorParallel(module, tp, o.stream);
  return success();
}

} // namespace mlir::piper::tensor_parallel

LogicalResult mlir::piper::applyShardTensor(ModuleOp module, ProgramOp program,
                                            const Directive &d) {
  return tensor_parallel::ShardTensor(module, d).run(program);
}
