// The `shard` directive: expert parallelism (docs/expert-parallel.md). The
// experts of every MoE layer of a stage are split over consecutive groups of
// its data-parallel replicas; each layer's forward and backward exchange
// the router's real per-member row counts and the routed rows with
// all-to-alls (`piper.ep_exchange`, which piper-lower-segment-collectives
// cuts the stage's segments around).
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERSHARD
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

namespace {

RankedTensorType i32(MLIRContext *ctx, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, IntegerType::get(ctx, 32));
}

/// The counts of a layer routed by `indices` over E experts of C slots.
MoeEpCountsOp counts(OpBuilder &b, Location loc, Value indices, int64_t e,
                     int64_t c, int64_t g) {
  MLIRContext *ctx = b.getContext();
  return MoeEpCountsOp::create(b, loc, i32(ctx, {g}), i32(ctx, {e, 1}),
                               i32(ctx, {g}), indices, e, c, g);
}

/// Around one MoE layer, forward or backward: `slots` (a source slot
/// buffer [E*C, H]) goes to the experts' owners, laid out as their local
/// slots; `back` (local slots, computed there) comes back as a source slot
/// buffer before `backAt`. Returns (local slots, source slots).
std::pair<Value, Value> exchangeAround(OpBuilder &b, Location loc,
                                       Value indices, Value slots,
                                       Operation *slotsAfter, Value back,
                                       Operation *backAt, int64_t e, int64_t c,
                                       int64_t g, StringRef stream) {
  Type rows = slots.getType();
  b.setInsertionPointAfter(slotsAfter);
  MoeEpCountsOp n = counts(b, loc, indices, e, c, g);
  auto packed =
      MoeEpPackOp::create(b, loc, rows, slots, n.getExpertCounts(), e, c);
  auto sent = EpExchangeOp::create(b, loc, rows, n.getSendCounts().getType(),
                                   packed, n.getSendCounts(), g, stream);
  auto owned = EpExchangeOp::create(
      b, loc, n.getExpertCounts().getType(), n.getExpertSendCounts().getType(),
      n.getExpertCounts(), n.getExpertSendCounts(), g, stream);
  auto local = MoeEpGatherOp::create(b, loc, rows, sent.getResult(),
                                     owned.getResult(), e, c, g);
  slots.replaceAllUsesExcept(local, packed);

  b.setInsertionPoint(backAt);
  auto out =
      MoeEpScatterOp::create(b, loc, rows, back, owned.getResult(), e, c, g);
  auto returned =
      EpExchangeOp::create(b, loc, rows, sent.getRecvCounts().getType(), out,
                           sent.getRecvCounts(), g, stream);
  auto source = MoeEpUnpackOp::create(b, loc, rows, returned.getResult(),
                                      n.getExpertCounts(), e, c);
  back.replaceAllUsesExcept(source, out);
  return {local, source};
}

/// Rewrites one segment's MoE layers for expert-parallel groups of `g`
/// exchanging on `stream`; returns how many it had.
FailureOr<int> rewriteLayers(SegmentOp seg, int64_t g, StringRef stream,
                             llvm::SetVector<StringAttr> &expertParams,
                             const Directive &d) {
  OpBuilder b(seg.getContext());
  int layers = 0;
  if (!seg.getOps<MoeEpCountsOp>().empty())
    return seg.emitOpError(d.describe())
           << ": its MoE layers are already split by another shard directive";
  SmallVector<MoeDispatchOp> dispatches(seg.getOps<MoeDispatchOp>());
  for (MoeDispatchOp dispatch : dispatches) {
    int64_t e = dispatch.getExperts(), c = dispatch.getCapacity();
    if (e % g != 0)
      return seg.emitOpError(d.describe())
             << ": " << e << " experts cannot be split over expert-parallel "
             << "groups of " << g << " devices";
    // The expert outputs go back before the layer's combine; in a backward
    // that recomputes the layer (docs/recompute.md), before the first
    // reader of the recomputed outputs, its combine gradient.
    Value back;
    for (MoeCombineOp op : seg.getOps<MoeCombineOp>())
      if (op.getIndices() == dispatch.getIndices())
        back = op.getInput();
    if (!back)
      for (MoeCombineGradOp op : seg.getOps<MoeCombineGradOp>())
        if (op.getIndices() == dispatch.getIndices() &&
            op.getInput().getDefiningOp())
          back = op.getInput();
    if (!back)
      return dispatch.emitOpError("has no moe_combine of the same routing");
    Operation *backAt =
        *llvm::min_element(back.getUsers(), [](Operation *x, Operation *y) {
          return x->isBeforeInBlock(y);
        });
    exchangeAround(b, dispatch.getLoc(), dispatch.getIndices(),
                   dispatch.getResult(), dispatch, back, backAt, e, c, g,
                   stream);
    ++layers;
  }
  SmallVector<MoeCombineGradOp> grads(seg.getOps<MoeCombineGradOp>());
  for (MoeCombineGradOp cg : grads) {
    int64_t e = cg.getExperts(), c = cg.getCapacity();
    if (e % g != 0)
      return seg.emitOpError(d.describe())
             << ": " << e << " experts cannot be split over expert-parallel "
             << "groups of " << g << " devices";
    MoeDispatchGradOp dg;
    for (MoeDispatchGradOp op : seg.getOps<MoeDispatchGradOp>())
      if (op.getIndices() == cg.getIndices())
        dg = op;
    if (!dg)
      return cg.emitOpError("has no moe_dispatch_grad of the same routing");
    exchangeAround(b, cg.getLoc(), cg.getIndices(), cg.getResult(0), cg,
                   dg.getGrad(), dg, e, c, g, stream);
    ++layers;
  }
  // The experts each member keeps.
  seg.walk([&](Operation *op) {
    if (auto fwd = dyn_cast<ExpertLinearOp>(op)) {
      fwd.setExperts(fwd.getExperts() / g);
      if (auto ref = fwd.getWeight().getDefiningOp<ParamRefOp>())
        expertParams.insert(ref.getParamAttr().getAttr());
    } else if (auto gi = dyn_cast<ExpertLinearGradInputOp>(op)) {
      gi.setExperts(gi.getExperts() / g);
    } else if (auto gw = dyn_cast<ExpertLinearGradWeightOp>(op)) {
      gw.setExperts(gw.getExperts() / g);
    }
  });
  return layers;
}

RankedTensorType localType(Type global, int64_t g) {
  auto t = cast<RankedTensorType>(global);
  SmallVector<int64_t> shape(t.getShape());
  shape[0] /= g;
  return RankedTensorType::get(shape, t.getElementType());
}

} // namespace

LogicalResult mlir::piper::applyShard(ModuleOp module, ProgramOp program,
                                      const Directive &d) {
  const auto &o = d.get<ShardOptions>();
  if (!llvm::is_sorted(o.devices) ||
      std::adjacent_find(o.devices.begin(), o.devices.end()) != o.devices.end())
    return program.emitOpError(d.describe())
           << ": devices must be listed in increasing order (member i of an "
              "expert-parallel group is its i-th device)";
  // Under tensor parallelism experts split over the data-parallel replicas
  // of each member (Megatron's "parallel folding": TP on attention, EP on
  // the experts), whole on every member of a tensor-parallel group.
  const MeshAttr mesh = getMesh(module);
  const int64_t tp = mesh.getTp();
  // Experts are split over this many devices.
  const int64_t members =
      o.ep > 0 ? o.ep : static_cast<int64_t>(o.devices.size()) / tp;
  SmallVector<SmallVector<int64_t>> groups =
      expertGroups(o.devices, members, mesh);
  if (groups.empty())
    return program.emitOpError(d.describe())
           << ": expert-parallel groups of " << members << " over "
           << o.devices.size() << " devices"
           << (tp > 1 ? " (data-parallel replicas of tensor-parallel groups "
                        "of " +
                            std::to_string(tp) + ")"
                      : std::string())
           << " do not tile them";

  // The stage's forward and backward tasks on these devices: on all of
  // them, or on a device group of whole expert-parallel groups of them (a
  // stage with two copies, DualPipe's, on two groups: one directive over
  // both, since the copies share the stage's segments).
  std::optional<int64_t> pp;
  if (auto it = d.filter.entries.find("PP"); it != d.filter.entries.end())
    pp = it->second.index;
  SmallVector<TaskOp> tasks;
  llvm::DenseSet<Attribute> checked;
  for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
    if (!t.getDevices() ||
        !(t.getTag().isPass(PassKind::F) || t.getTag().isPass(PassKind::B)) ||
        (pp && t.getTag().getPp() != pp) ||
        !llvm::all_of(t.getNodeDevices(), [&](int64_t dev) {
          return llvm::is_contained(o.devices, dev);
        }))
      continue;
    tasks.push_back(t);
    if (!checked.insert(t.getDevicesAttr()).second)
      continue;
    // piper-lower-segment-collectives exchanges over the layout's ep groups
    // of the task's devices: they must be groups of the directive's.
    ArrayRef<int64_t> own = t.getNodeDevices();
    SmallVector<SmallVector<int64_t>> ownGroups =
        expertGroups(own, members, mesh);
    if (ownGroups.empty() || !llvm::all_of(ownGroups, [&](ArrayRef<int64_t> g) {
          return llvm::any_of(groups,
                              [&](ArrayRef<int64_t> h) { return h == g; });
        }))
      return t.emitOpError(d.describe())
             << ": " << describeNode(t) << " runs on " << formatDevices(own)
             << ", which is not made of whole expert-parallel groups of "
             << members << " of " << formatDevices(o.devices);
  }
  if (tasks.empty())
    return program.emitOpError(d.describe())
           << ": no forward or backward task runs on "
           << formatDevices(o.devices) << "; place the stage there first";

  SymbolTable symbols(module);
  llvm::SetVector<StringAttr> expertParams;
  llvm::DenseSet<StringAttr> rewritten;
  int layers = 0;
  for (TaskOp t : tasks) {
    StringAttr name = t.getSegmentAttr().getAttr();
    if (!rewritten.insert(name).second)
      continue;
    FailureOr<int> n = rewriteLayers(symbols.lookup<SegmentOp>(name), members,
                                     o.stream, expertParams, d);
    if (failed(n))
      return failure();
    layers += *n;
  }
  // A shard naming a stage must find MoE layers in it. Without "PP" it
  // covers every stage on its devices (what --ep writes, one per device
  // group): a group whose stages have none (the LM head alone) is left
  // alone, as long as the model has MoE layers somewhere.
  if (layers == 0 && !pp) {
    bool moe = false;
    module.walk([&](Operation *op) {
      if (isa<MoeDispatchOp, MoeEpCountsOp>(op))
        moe = true;
    });
    if (moe)
      return success();
  }
  if (layers == 0)
    return program.emitOpError(d.describe())
           << ": the filter matches no expert region (no MoE layer runs on "
           << formatDevices(o.devices) << ")";

  // Each member keeps its block of every expert weight: the parameter, its
  // reads and its weight gradient become local.
  for (StringAttr name : expertParams) {
    auto param = symbols.lookup<ParamOp>(name);
    if (param.getExpertMembers())
      return param.emitOpError(d.describe())
             << ": the experts of @" << name.getValue()
             << " are already split by another shard directive";
    param.setType(localType(param.getType(), members));
    param.setExpertMembers(members);
  }
  module.walk([&](ParamRefOp ref) {
    if (expertParams.contains(ref.getParamAttr().getAttr()))
      ref.getResult().setType(
          symbols.lookup<ParamOp>(ref.getParamAttr().getAttr()).getType());
  });
  module.walk([&](AccumulateGradOp acc) {
    StringAttr p = acc.getParamAttr().getAttr();
    if (!expertParams.contains(p))
      return;
    if (auto wg = acc.getGrad().getDefiningOp<ExpertLinearGradWeightOp>())
      wg.getResult().setType(symbols.lookup<ParamOp>(p).getType());
  });
  return success();
}

namespace {
struct ShardPass : mlir::piper::impl::PiperShardBase<ShardPass> {
  using PiperShardBase::PiperShardBase;
  void runOnOperation() override {
    ShardOptions o;
    o.devices.assign(devices.begin(), devices.end());
    o.ep = ep;
    o.stream = stream;
    Directive d = stageDirective(o, pp, "piper-shard");
    d.filter.entries["EP"] = {FilterValue::Any, 0, ""};
    if (failed(applyDirective(getOperation(), d, std::nullopt)))
      signalPassFailure();
  }
};
} // namespace
