// piper-tie-params: one all-reduce over every device group that holds a
// copy of a shared parameter (a tied LM head).
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include <set>

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERTIEPARAMS
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

LogicalResult mlir::piper::tieSharedParams(ModuleOp module) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  SegmentParams segmentParams(module);
  auto shared = sharedParams(segmentParams, *program);
  if (shared.empty())
    return success();
  Block &body = program->getBody().front();
  SymbolTable &symbols = segmentParams.getSymbols();
  // One all-reduce per set of groups holding copies (every stage of
  // DualPipe's two copies of the model on the same two groups shares one),
  // and per expert-parallel width: member i of an expert-parallel group
  // holds block i of an expert weight, so its gradient is summed over the
  // members i of every group holding a copy.
  struct Bucket {
    SmallVector<ArrayRef<int64_t>> groups;
    int64_t members;
    SmallVector<Attribute> params;
  };
  SmallVector<Bucket> buckets;
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
    int64_t width = static_cast<int64_t>(
        symbols.lookup<ParamOp>(param).getExpertMembers().value_or(1));
    for (ArrayRef<int64_t> g : groups)
      if (g.size() % width != 0)
        return program->emitOpError("parameter @")
               << param.getValue() << " is split over expert-parallel groups "
               << "of " << width << ", which do not divide its copy's group "
               << formatDevices(g);
    SmallVector<ArrayRef<int64_t>> key(groups.begin(), groups.end());
    llvm::sort(key, [](ArrayRef<int64_t> a, ArrayRef<int64_t> b) {
      return a.front() < b.front();
    });
    auto same = llvm::find_if(buckets, [&](const Bucket &b) {
      return b.members == width && b.groups == key;
    });
    if (same == buckets.end())
      same = buckets.insert(buckets.end(), Bucket{key, width, {}});
    same->params.push_back(FlatSymbolRefAttr::get(param));
  }
  OpBuilder b(module.getContext());
  int64_t collective = 0;
  for (const Bucket &bucket : buckets) {
    // After every backward task of the groups holding a copy, not only
    // those that accumulate it: this collective spans device classes on
    // dp_stream, where ZeRO-2/3's per-piece reduce-scatters also run, and
    // later backward pieces wait for those (boundZeroCollectives). Issued
    // before them, it would hold them back until the other class arrives,
    // which may first need this class's later backward pieces: a deadlock.
    SmallVector<Value> deps;
    TaskOp last;
    for (TaskOp t : body.getOps<TaskOp>()) {
      if (!t.getTag().isBackward() || !t.getDevices() ||
          !llvm::is_contained(bucket.groups, t.getNodeDevices()))
        continue;
      deps.push_back(t.getDone());
      last = t;
    }
    b.setInsertionPointAfter(last);
    std::set<int64_t> members;
    for (ArrayRef<int64_t> g : bucket.groups)
      members.insert(g.begin(), g.end());
    SmallVector<int64_t> devices(members.begin(), members.end());
    auto ar = AllReduceOp::create(
        b, last.getLoc(), b.getArrayAttr(bucket.params), deps,
        DeviceGroupAttr::get(b.getContext(), devices),
        commStream(*program, "dp_stream"), TagAttr::get(b.getContext()),
        b.getI64IntegerAttr(collective++));
    if (bucket.members > 1) {
      SmallVector<Attribute> sameBlock;
      for (int64_t i = 0; i < bucket.members; ++i) {
        SmallVector<int64_t> ranks;
        for (ArrayRef<int64_t> g : bucket.groups)
          for (size_t r = i; r < g.size(); r += bucket.members)
            ranks.push_back(g[r]);
        llvm::sort(ranks);
        sameBlock.push_back(DeviceGroupAttr::get(b.getContext(), ranks));
      }
      ar.setSubgroupsAttr(b.getArrayAttr(sameBlock));
    }
    llvm::DenseSet<StringAttr> names;
    for (Attribute p : bucket.params)
      names.insert(cast<FlatSymbolRefAttr>(p).getAttr());
    for (TaskOp u : body.getOps<TaskOp>()) {
      if (!u.getTag().isPass(PassKind::U))
        continue;
      if (llvm::any_of(segmentParams.updated(u.getSegment()),
                       [&](StringAttr p) { return names.contains(p); }))
        u.getDepsMutable().append(ValueRange{ar.getDone()});
    }
  }
  return sortTopologically(body);
}

namespace {
struct TieParamsPass
    : mlir::piper::impl::PiperTieParamsBase<TieParamsPass> {
  void runOnOperation() override {
    if (failed(tieSharedParams(getOperation())))
      signalPassFailure();
  }
};
} // namespace
