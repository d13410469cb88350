// piper-tie-params: one all-reduce over every device group that holds a
// copy of a shared parameter (a tied LM head).
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include <set>

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERTIEPARAMS
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

LogicalResult mlir::piper::tieSharedParams(ModuleOp module, double bucketMb) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  SegmentParams segmentParams(module);
  auto shared = sharedParams(segmentParams, *program);
  if (shared.empty())
    return success();
  Block &body = program->getBody().front();
  SymbolTable &symbols = segmentParams.getSymbols();
  // The ZeRO reduce-scatters of each parameter (replicate shards a shared
  // parameter over each group holding a copy): member i of every group
  // holds range i of its group's sum.
  llvm::DenseMap<StringAttr, SmallVector<Value>> scattered;
  llvm::DenseMap<StringAttr, llvm::DenseSet<Attribute>> scatteredOn;
  for (auto rs : body.getOps<ReduceScatterGradsOp>())
    for (Attribute a : rs.getParamRefs()) {
      StringAttr p = cast<FlatSymbolRefAttr>(a).getAttr();
      scattered[p].push_back(rs.getDone());
      scatteredOn[p].insert(rs.getDevicesAttr());
    }
  // One reduction per set of groups holding copies (every stage of
  // DualPipe's two copies of the model on the same two groups shares one)
  // and per way of pairing their members, in buckets of `bucketMb` (a
  // multi-parameter all-reduce is staged in one block):
  // - whole gradients: every rank of every group;
  // - expert weights split over expert-parallel groups of `width`: member i
  //   of an expert-parallel group holds block i, summed over the members i
  //   of every group holding a copy;
  // - ZeRO ranges: member i of every group holds range i of its group's
  //   sum (ZeRO-1: valid in the whole accumulator's range i; ZeRO-2 and 3:
  //   its shard buffer), summed over the members i of every group.
  struct Bucket {
    SmallVector<ArrayRef<int64_t>> groups;
    int64_t width; // ranks that hold different pieces, 1: none
    bool ranges;   // ZeRO: pair member i of each group
    SmallVector<StringAttr> params;
  };
  SmallVector<Bucket> sets;
  for (auto &[param, groups] : shared) {
    // Every rank holding a copy takes part: the sum over all of them is the
    // full gradient (each copy saw one use, each replica one slice of data).
    std::set<int64_t> members;
    for (ArrayRef<int64_t> g : groups)
      members.insert(g.begin(), g.end());
    size_t total = 0;
    for (ArrayRef<int64_t> g : groups)
      total += g.size();
    if (members.size() != total)
      return program->emitOpError("parameter @")
             << param.getValue()
             << " is shared by device groups that overlap; its gradient "
                "cannot be summed once per copy";
    bool ranges = scattered.count(param) > 0;
    if (ranges)
      for (ArrayRef<int64_t> g : groups)
        if (!scatteredOn[param].contains(
                DeviceGroupAttr::get(module.getContext(), g)))
          return program->emitOpError("parameter @")
                 << param.getValue()
                 << " is ZeRO-sharded on some device groups holding its "
                    "copies but not on "
                 << formatDevices(g)
                 << "; replicate the groups holding its copies with the same "
                    "ZeRO stage";
    // Member i of each group sums with member i of the others: a ZeRO
    // range, an expert block, or a tensor-parallel member (which holds its
    // slice, or its own whole copy of a parameter the members share).
    int64_t width =
        ranges ? static_cast<int64_t>(groups.front().size())
               : std::max<int64_t>(
                     static_cast<int64_t>(symbols.lookup<ParamOp>(param)
                                              .getExpertMembers()
                                              .value_or(1)),
                     getMesh(module).getTp());
    for (ArrayRef<int64_t> g : groups)
      if (g.size() % width != 0 || (ranges && g.size() != groups[0].size()))
        return program->emitOpError("parameter @")
               << param.getValue() << " is split over groups of " << width
               << " ranks ("
               << (ranges                        ? "ZeRO"
                   : getMesh(module).getTp() > 1 ? "tensor parallelism"
                                                 : "expert parallelism")
               << "), which its copy's group " << formatDevices(g)
               << " does not match";
    SmallVector<ArrayRef<int64_t>> key(groups.begin(), groups.end());
    llvm::sort(key, [](ArrayRef<int64_t> a, ArrayRef<int64_t> b) {
      return a.front() < b.front();
    });
    auto same = llvm::find_if(sets, [&](const Bucket &b) {
      return b.width == width && b.ranges == ranges && b.groups == key;
    });
    if (same == sets.end())
      same = sets.insert(sets.end(), Bucket{key, width, ranges, {}});
    same->params.push_back(param);
  }
  OpBuilder b(module.getContext());
  int64_t collective = 0;
  for (const Bucket &set : sets) {
    // After every backward task of the groups holding a copy, not only
    // those that accumulate it: this collective spans device classes on
    // dp_stream, where ZeRO-2/3's per-piece reduce-scatters also run, and
    // later backward pieces wait for those (boundZeroCollectives). Issued
    // before them, it would hold them back until the other class arrives,
    // which may first need this class's later backward pieces: a deadlock.
    // ZeRO ranges also wait for their reduce-scatters.
    SmallVector<Value> deps;
    Operation *last = nullptr;
    auto after = [&](Value done) {
      deps.push_back(done);
      Operation *op = done.getDefiningOp();
      if (!last || last->isBeforeInBlock(op))
        last = op;
    };
    for (TaskOp t : body.getOps<TaskOp>())
      if (t.getTag().isBackward() && t.getDevices() &&
          llvm::is_contained(set.groups, t.getNodeDevices()))
        after(t.getDone());
    if (set.ranges)
      for (StringAttr p : set.params)
        for (Value done : scattered.lookup(p))
          after(done);
    b.setInsertionPointAfter(last);
    std::set<int64_t> members;
    for (ArrayRef<int64_t> g : set.groups)
      members.insert(g.begin(), g.end());
    SmallVector<int64_t> devices(members.begin(), members.end());
    ArrayAttr subgroups;
    if (set.width > 1) {
      SmallVector<Attribute> sameBlock;
      for (int64_t i = 0; i < set.width; ++i) {
        SmallVector<int64_t> ranks;
        for (ArrayRef<int64_t> g : set.groups)
          for (size_t r = i; r < g.size(); r += set.width)
            ranks.push_back(g[r]);
        llvm::sort(ranks);
        sameBlock.push_back(DeviceGroupAttr::get(b.getContext(), ranks));
      }
      subgroups = b.getArrayAttr(sameBlock);
    }
    for (auto &bucket : bucketParams(symbols, set.params, bucketMb)) {
      auto ar = AllReduceOp::create(
          b, last->getLoc(), b.getArrayAttr(bucket), deps,
          DeviceGroupAttr::get(b.getContext(), devices),
          commStream(*program, "dp_stream"), TagAttr::get(b.getContext()),
          b.getI64IntegerAttr(collective++));
      if (subgroups)
        ar.setSubgroupsAttr(subgroups);
      b.setInsertionPointAfter(ar);
      llvm::DenseSet<StringAttr> names;
      for (Attribute p : bucket)
        names.insert(cast<FlatSymbolRefAttr>(p).getAttr());
      for (TaskOp u : body.getOps<TaskOp>()) {
        if (!u.getTag().isPass(PassKind::U))
          continue;
        if (llvm::any_of(segmentParams.updated(u.getSegment()),
                         [&](StringAttr p) { return names.contains(p); }))
          u.getDepsMutable().append(ValueRange{ar.getDone()});
      }
    }
  }
  return sortTopologically(body);
}

namespace {
struct TieParamsPass : mlir::piper::impl::PiperTieParamsBase<TieParamsPass> {
  using PiperTieParamsBase::PiperTieParamsBase;
  void runOnOperation() override {
    if (!(bucketMb > 0)) {
      getOperation().emitError("piper-tie-params: bucket-mb must be "
                               "positive, got ")
          << bucketMb;
      return signalPassFailure();
    }
    if (failed(tieSharedParams(getOperation(), bucketMb)))
      signalPassFailure();
  }
};
} // namespace
