// The `replicate` directive and the piper-replicate pass: data parallelism
// as bucketed gradient all-reduces.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERREPLICATE
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

//===----------------------------------------------------------------------===//
// replicate
//===----------------------------------------------------------------------===//

/// One `piper.all_reduce grads` per bucket of `params` (gradient-ready
/// order) after the stage's last backward, over d.devices (each rank with
/// its subgroup of it, when `subgroups` is set); every update of one of
/// them waits for the reductions, whether or not the directive's filter
/// matched it.
static void allReduceGradients(ProgramOp program, const Directive &d,
                               SegmentParams &segmentParams,
                               ArrayRef<StringAttr> params,
                               ArrayRef<TaskOp> backward, TagAttr stageTag,
                               ArrayAttr subgroups) {
  SmallVector<Value> deps;
  for (TaskOp t : backward)
    deps.push_back(t.getDone());
  TaskOp last = backward.back();
  OpBuilder b(last);
  b.setInsertionPointAfter(last);
  auto group = DeviceGroupAttr::get(b.getContext(), d.devices);
  StreamAttr stream = commStream(program, d.reduceStream);
  SmallVector<Value> reduced;
  for (auto &bucket :
       bucketParams(segmentParams.getSymbols(), params, d.bucketSizeMb)) {
    auto ar = AllReduceOp::create(b, last.getLoc(), b.getArrayAttr(bucket),
                                  deps, group, stream, stageTag,
                                  /*collective=*/IntegerAttr());
    if (subgroups)
      ar.setSubgroupsAttr(subgroups);
    reduced.push_back(ar.getDone());
  }
  llvm::DenseSet<StringAttr> summed(params.begin(), params.end());
  for (TaskOp u : program.getBody().front().getOps<TaskOp>())
    if (u.getTag().isPass(PassKind::U) &&
        llvm::any_of(segmentParams.updated(u.getSegment()),
                     [&](StringAttr p) { return summed.contains(p); }))
      u.getDepsMutable().append(reduced);
}

LogicalResult mlir::piper::applyReplicate(ModuleOp module, ProgramOp program,
                                    const Directive &d,
                                    std::optional<int64_t> worldSize) {
  if (failed(checkDevices(program, d, worldSize)))
    return failure();
  SmallVector<TaskOp> tasks = matchingTasks(program, d.filter);
  if (tasks.empty())
    return program.emitOpError(d.describe()) << ": the filter matches no task"
                                     << splitPassHint(d.filter);
  for (TaskOp t : tasks)
    if (!t.getDevices() || t.getNodeDevices() != ArrayRef(d.devices))
      return t.emitOpError(d.describe())
             << ": " << describeNode(t) << " runs on "
             << (t.getDevices() ? formatDevices(t.getNodeDevices())
                                : std::string("no device"))
             << ", not on " << formatDevices(d.devices)
             << "; place it on the replicated devices first";
  int64_t replicas = d.devices.size();
  if (d.zero > 0 && replicas < 2)
    return program.emitOpError(d.describe())
           << ": ZeRO-" << d.zero
           << " shards state over the data-parallel replicas of a stage, but "
              "this replicate has one device";
  if (program.getReplicated() &&
      program.getNumReplicasAttr().getInt() != replicas)
    return program.emitOpError(d.describe())
           << ": data-parallel degree " << replicas
           << " differs from the degree " << program.getNumReplicas()
           << " of an earlier replicate";
  Builder attrs(module.getContext());
  program.setReplicated(true);
  program.setNumReplicas(replicas);

  SegmentParams segmentParams(module);
  SymbolTable &symbols = segmentParams.getSymbols();
  SmallVector<TaskOp> backward;
  llvm::SetVector<StringAttr> params;
  TagAttr stageTag;
  for (TaskOp t : tasks) {
    if (t.getTag().isBackward()) {
      backward.push_back(t);
      // Backward order: the last layers' gradients are ready first.
      params.insert_range(segmentParams.accumulated(t.getSegment()));
      if (auto pp = t.getTag().getPp())
        stageTag = TagAttr::get(attrs.getContext(), *pp, std::nullopt,
                                std::nullopt, std::nullopt, std::nullopt);
    }
  }
  // Parameters shared with another stage are summed over both stages'
  // groups at once by tieSharedParams, which subsumes this reduction.
  auto shared = sharedParams(segmentParams, program);
  params.remove_if([&](StringAttr p) { return shared.count(p) > 0; });
  if (!stageTag)
    stageTag = TagAttr::get(attrs.getContext());
  // Expert weights split by `shard` (expert_members = G): member i of each
  // expert-parallel group holds block i, so their gradients are summed over
  // the replicas holding the same block (every G-th), never sharded by ZeRO.
  SmallVector<StringAttr> experts;
  int64_t members = 1;
  params.remove_if([&](StringAttr p) {
    std::optional<uint64_t> m = symbols.lookup<ParamOp>(p).getExpertMembers();
    if (!m)
      return false;
    members = static_cast<int64_t>(*m);
    experts.push_back(p);
    return true;
  });
  if (!experts.empty() && replicas % members != 0)
    return program.emitOpError(d.describe())
           << ": expert-parallel groups of " << members
           << " do not divide the " << replicas << " replicas";
  if (!experts.empty() && replicas / members >= 2) {
    SmallVector<Attribute> sameExperts;
    for (int64_t i = 0; i < members; ++i) {
      SmallVector<int64_t> ranks;
      for (int64_t r = i; r < replicas; r += members)
        ranks.push_back(d.devices[r]);
      sameExperts.push_back(DeviceGroupAttr::get(attrs.getContext(), ranks));
    }
    allReduceGradients(program, d, segmentParams, experts, backward, stageTag,
                       ArrayAttr::get(attrs.getContext(), sameExperts));
  }
  if (replicas == 1 || params.empty())
    return success();
  if (d.zero > 0)
    return applyZero(module, program, d, params, backward, stageTag);

  allReduceGradients(program, d, segmentParams, params.getArrayRef(),
                     backward, stageTag, ArrayAttr());
  return sortTopologically(program.getBody().front());
}

namespace {
struct ReplicatePass : mlir::piper::impl::PiperReplicateBase<ReplicatePass> {
  using PiperReplicateBase::PiperReplicateBase;
  void runOnOperation() override {
    if (failed(verifyDeviceGroup(devices, "piper-replicate devices", [&] {
          return getOperation().emitError();
        })))
      return signalPassFailure();
    Directive d = stageDirective(Directive::Replicate, pp, devices,
                                 "piper-replicate");
    d.bucketSizeMb = bucketMb;
    d.reduceStream = reduceStream;
    d.zero = zero;
    d.gatherStream = gatherStream.empty() ? reduceStream : gatherStream;
    if (failed(applyDirective(getOperation(), d, std::nullopt)))
      signalPassFailure();
  }
};
} // namespace
