// piper-tie-params: one all-reduce over every device group that holds a
// copy of a shared parameter (a tied LM head).
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

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
  OpBuilder b(module.getContext());
  int64_t collective = 0;
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
          !llvm::is_contained(groups, t.getNodeDevices()))
        continue;
      deps.push_back(t.getDone());
      last = t;
    }
    b.setInsertionPointAfter(last);
    SmallVector<int64_t> devices(members.begin(), members.end());
    auto ar = AllReduceOp::create(
        b, last.getLoc(), b.getArrayAttr({FlatSymbolRefAttr::get(param)}),
        deps, DeviceGroupAttr::get(b.getContext(), devices),
        commStream(*program, "dp_stream"), TagAttr::get(b.getContext()),
        b.getI64IntegerAttr(collective++));
    for (TaskOp u : body.getOps<TaskOp>()) {
      if (!u.getTag().isPass(PassKind::U))
        continue;
      if (llvm::is_contained(segmentParams.updated(u.getSegment()), param))
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
