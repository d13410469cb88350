// The `replicate` directive and the piper-replicate pass: data parallelism
// as bucketed gradient all-reduces.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

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
/// order) after the stage's last backward, over the directive's devices (each
/// rank with its subgroup of it, when `subgroups` is set) on `stream` (the
/// directive's reduce stream); every update of one of them waits for the
/// reductions, whether or not the directive's filter matched it.
static void allReduceGradients(ProgramOp program, const Directive &d,
                               SegmentParams &segmentParams,
                               ArrayRef<StringAttr> params,
                               ArrayRef<TaskOp> backward, TagAttr stageTag,
                               ArrayAttr subgroups, StreamAttr stream) {
  const auto &o = d.get<ReplicateOptions>();
  SmallVector<Value> deps;
  for (TaskOp t : backward)
    deps.push_back(t.getDone());
  TaskOp last = backward.back();
  OpBuilder b(last);
  b.setInsertionPointAfter(last);
  auto group = DeviceGroupAttr::get(b.getContext(), o.devices);
  SmallVector<Value> reduced;
  for (auto &bucket :
       bucketParams(segmentParams.getSymbols(), params, o.bucketMb)) {
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

/// For each parameter whose gradient a reduction over exactly `group` and
/// `subgroups` (one that an earlier directive inserted) names: that
/// reduction's ZeRO stage (0: an all-reduce).
static llvm::DenseMap<StringAttr, int64_t>
earlierReductions(ProgramOp program, DeviceGroupAttr group,
                  ArrayAttr subgroups) {
  llvm::DenseMap<StringAttr, int64_t> zeroOf;
  auto add = [&](ArrayRef<Attribute> refs, int64_t zero) {
    for (Attribute a : refs)
      zeroOf.try_emplace(cast<FlatSymbolRefAttr>(a).getAttr(), zero);
  };
  for (Operation &op : program.getBody().front()) {
    if (auto ar = dyn_cast<AllReduceOp>(op);
        ar && ar.getDevices() == group && ar.getSubgroupsAttr() == subgroups)
      add(ar.getParams(), 0);
    if (auto rs = dyn_cast<ReduceScatterGradsOp>(op);
        rs && rs.getDevices() == group && rs.getSubgroupsAttr() == subgroups)
      add(rs.getParamRefs(), static_cast<int64_t>(rs.getZero()));
  }
  return zeroOf;
}

/// A parameter that the backward of another stage on the same devices
/// accumulates too (a tied embedding whose first and last stages a V layout,
/// or interleaving on one group, puts together; sharedParams sees one
/// device group and leaves it to replicate) has one accumulator per rank,
/// which both stages add to. Without ZeRO, and under ZeRO-1, that whole
/// accumulator is reduced once, after every backward task of the group that
/// adds to it: reduced after one stage's backwards only, it would race
/// with the other stage's accumulation, and a second reduction by the other
/// stage's replicate would sum the first stage's part again. The first
/// replicate of the group inserts that reduction (waiting for the other
/// stages' backwards too); later ones find it and leave the parameter out.
/// ZeRO-2 and 3 reduce every piece's gradients separately, each once, so
/// each stage's replicate reduces its own. Stages that share a parameter
/// must use the same ZeRO stage. Moves the parameters that need one
/// reduction after `backward` and `others` from `params` to `colocated`,
/// and appends to `others` the other stages' backward tasks that add to
/// them.
static LogicalResult
splitColocatedParams(ProgramOp program, const Directive &d,
                     SegmentParams &segmentParams, ArrayRef<TaskOp> backward,
                     ArrayAttr subgroups, llvm::SetVector<StringAttr> &params,
                     llvm::SetVector<StringAttr> &colocated,
                     SmallVector<TaskOp> &others) {
  const auto &o = d.get<ReplicateOptions>();
  auto group = DeviceGroupAttr::get(program.getContext(), o.devices);
  llvm::DenseMap<StringAttr, int64_t> earlier =
      earlierReductions(program, group, subgroups);
  llvm::DenseSet<StringAttr> reducedEarlier;
  for (StringAttr p : params) {
    auto zero = earlier.find(p);
    if (zero == earlier.end())
      continue;
    if (zero->second != o.zero)
      return program.emitOpError(d.describe())
             << ": parameter @" << p.getValue()
             << " is accumulated by several stages on "
             << formatDevices(o.devices) << ", replicated with ZeRO-"
             << zero->second << " and ZeRO-" << o.zero
             << "; replicate the stages of one device group with the same "
                "ZeRO stage";
    if (o.zero <= 1)
      reducedEarlier.insert(p);
  }
  params.remove_if([&](StringAttr p) { return reducedEarlier.contains(p); });
  if (o.zero > 1)
    return success();
  llvm::SmallPtrSet<Operation *, 16> matched;
  for (TaskOp t : backward)
    matched.insert(t);
  for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
    if (!t.getTag().isBackward() || t.getDevicesAttr() != group ||
        matched.contains(t))
      continue;
    bool adds = false;
    for (StringAttr p : segmentParams.accumulated(t.getSegment()))
      if (params.contains(p) || colocated.contains(p)) {
        colocated.insert(p);
        adds = true;
      }
    if (adds)
      others.push_back(t);
  }
  params.remove_if([&](StringAttr p) { return colocated.contains(p); });
  return success();
}

/// Splits `params` (the gradients `backward` adds to) into those only
/// `backward` adds to and the colocated ones other backward tasks on the
/// devices add to too (splitColocatedParams), and reduces each set with
/// `reduce`: the first after `backward`, the colocated ones after every
/// backward task that adds to them, in block order.
static LogicalResult reduceByColocation(
    ProgramOp program, const Directive &d, SegmentParams &segmentParams,
    ArrayRef<TaskOp> backward, ArrayAttr subgroups,
    llvm::SetVector<StringAttr> params,
    llvm::function_ref<LogicalResult(const llvm::SetVector<StringAttr> &,
                                     ArrayRef<TaskOp>)>
        reduce) {
  if (params.empty())
    return success();
  llvm::SetVector<StringAttr> colocated;
  SmallVector<TaskOp> afterAll;
  if (failed(splitColocatedParams(program, d, segmentParams, backward,
                                  subgroups, params, colocated, afterAll)))
    return failure();
  if (!params.empty() && failed(reduce(params, backward)))
    return failure();
  if (colocated.empty())
    return success();
  afterAll.append(backward.begin(), backward.end());
  llvm::sort(afterAll,
             [](TaskOp a, TaskOp b) { return a->isBeforeInBlock(b); });
  return reduce(colocated, afterAll);
}

/// The tasks of `d`'s filter on its devices. A stage with two copies on two
/// device groups (DualPipe) has one replicate per copy: tasks on a group
/// that shares no device with them belong to the other copy's. An error
/// for a task placed elsewhere, or when none is left.
static FailureOr<SmallVector<TaskOp>> replicatedTasks(ProgramOp program,
                                                      const Directive &d) {
  const auto &o = d.get<ReplicateOptions>();
  SmallVector<TaskOp> matched = matchingTasks(program, d.filter);
  if (matched.empty())
    return program.emitOpError(d.describe())
           << ": the filter matches no task" << splitPassHint(d.filter);
  SmallVector<TaskOp> tasks;
  for (TaskOp t : matched) {
    if (t.getDevices() && t.getNodeDevices() == ArrayRef(o.devices)) {
      tasks.push_back(t);
      continue;
    }
    if (t.getDevices() && llvm::none_of(t.getNodeDevices(), [&](int64_t dev) {
          return llvm::is_contained(o.devices, dev);
        }))
      continue;
    return t.emitOpError(d.describe())
           << ": " << describeNode(t) << " runs on "
           << (t.getDevices() ? formatDevices(t.getNodeDevices())
                              : std::string("no device"))
           << ", not on " << formatDevices(o.devices)
           << "; place it on the replicated devices first";
  }
  if (tasks.empty())
    return program.emitOpError(d.describe())
           << ": no task of the filter runs on " << formatDevices(o.devices)
           << "; place it on the replicated devices first";
  return tasks;
}

LogicalResult mlir::piper::applyReplicate(ModuleOp module, ProgramOp program,
                                          const Directive &d,
                                          std::optional<int64_t> worldSize) {
  const auto &o = d.get<ReplicateOptions>();
  if (failed(checkDevices(program, d, o.devices, worldSize)))
    return failure();
  FailureOr<SmallVector<TaskOp>> tasks = replicatedTasks(program, d);
  if (failed(tasks))
    return failure();
  // Under tensor parallelism the devices are data-parallel replicas of
  // tensor-parallel groups (consecutive members): gradients are summed over
  // the replicas of each member.
  const int64_t tp = getMesh(module).getTp();
  if (static_cast<int64_t>(o.devices.size()) % tp != 0)
    return program.emitOpError(d.describe())
           << ": its " << o.devices.size()
           << " devices are not whole tensor-parallel groups of " << tp;
  int64_t replicas = o.devices.size() / tp;
  if (o.zero > 0 && replicas < 2)
    return program.emitOpError(d.describe())
           << ": ZeRO-" << o.zero
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
  for (TaskOp t : *tasks) {
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
  // Under ZeRO they are sharded over each copy's group like the others
  // (the groups holding copies have the same size, --dp): piper-tie-params
  // then sums the copies' shards, member i of each group with member i of
  // the others, after this group's reduce-scatters. Expert weights are never
  // ZeRO-sharded.
  auto shared = sharedParams(segmentParams, program);
  params.remove_if([&](StringAttr p) {
    return shared.count(p) > 0 &&
           (o.zero == 0 || symbols.lookup<ParamOp>(p).getExpertMembers());
  });
  if (!stageTag)
    stageTag = TagAttr::get(attrs.getContext());
  // Whether the reduce stream is a compute stream: one walk, when first
  // needed (the reductions inserted below are not tasks: the answer stays).
  StreamAttr reduceStreamAttr;
  auto reduceStream = [&] {
    if (!reduceStreamAttr)
      reduceStreamAttr = commStream(program, o.reduceStream);
    return reduceStreamAttr;
  };
  // Sequence parallelism: a parameter read on each member's rows (a norm
  // weight, a row bias) has a partial gradient on every rank, summed over
  // the whole group at once: the tensor-parallel members and the data
  // replicas (no subgroups), even without data parallelism. Under ZeRO
  // these (vectors of the hidden size) stay whole on every rank, as expert
  // weights do; the other parameters are sharded.
  llvm::SetVector<StringAttr> partial;
  for (StringAttr p : params)
    if (isSequencePartial(symbols.lookup<ParamOp>(p)))
      partial.insert(p);
  params.remove_if([&](StringAttr p) { return partial.contains(p); });
  if (failed(reduceByColocation(
          program, d, segmentParams, backward, ArrayAttr(), partial,
          [&](const llvm::SetVector<StringAttr> &ps, ArrayRef<TaskOp> after) {
            allReduceGradients(program, d, segmentParams, ps.getArrayRef(),
                               after, stageTag, ArrayAttr(), reduceStream());
            return success();
          })))
    return failure();
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
           << ": expert-parallel groups of " << members << " do not divide the "
           << replicas << " replicas";
  // The layout's groups of the devices' replicas: the expert data groups
  // (the replicas holding the same experts) and the gradient groups.
  const ParallelLayout layout =
      getMesh(module).replicaLayout(o.devices.size(), members);
  if (!experts.empty() && replicas / members >= 2)
    allReduceGradients(
        program, d, segmentParams, experts, backward, stageTag,
        ArrayAttr::get(
            attrs.getContext(),
            deviceGroupAttrs(attrs.getContext(), o.devices, layout, Axis::edp)),
        reduceStream());
  if (replicas == 1 || params.empty())
    return success();
  // Member t of each tensor-parallel group sums with member t of the
  // others: the gradient groups.
  ArrayAttr sameMember;
  if (tp > 1)
    sameMember = ArrayAttr::get(
        attrs.getContext(),
        deviceGroupAttrs(attrs.getContext(), o.devices, layout, Axis::dpcp));
  // ZeRO shards what replication would all-reduce.
  if (failed(reduceByColocation(
          program, d, segmentParams, backward, sameMember, params,
          [&](const llvm::SetVector<StringAttr> &ps, ArrayRef<TaskOp> after) {
            if (o.zero > 0)
              return applyZero(module, program, d, ps, after, stageTag,
                               sameMember);
            allReduceGradients(program, d, segmentParams, ps.getArrayRef(),
                               after, stageTag, sameMember, reduceStream());
            return success();
          })))
    return failure();
  return o.zero > 0 ? success() : sortTopologically(program.getBody().front());
}

namespace {
struct ReplicatePass : mlir::piper::impl::PiperReplicateBase<ReplicatePass> {
  using PiperReplicateBase::PiperReplicateBase;
  void runOnOperation() override {
    ReplicateOptions o;
    o.devices.assign(devices.begin(), devices.end());
    o.bucketMb = bucketMb;
    o.reduceStream = reduceStream;
    o.zero = zero;
    o.gatherStream = gatherStream.empty() ? reduceStream : gatherStream;
    if (failed(applyDirective(getOperation(),
                              stageDirective(o, pp, "piper-replicate"),
                              std::nullopt)))
      signalPassFailure();
  }
};
} // namespace
