// The `split` directive and the piper-split pass: per-microbatch copies of
// the training DAG.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERSPLIT
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

//===----------------------------------------------------------------------===//
// split
//===----------------------------------------------------------------------===//

LogicalResult mlir::piper::applySplit(ProgramOp program, const Directive &d) {
  Block &body = program.getBody().front();
  if (program.getNumMicrobatches() != 1 ||
      llvm::any_of(body.getOps<TaskOp>(),
                   [](TaskOp t) { return t.getTag().getMb(); }))
    return program.emitOpError(d.describe() + ": the program is already split");
  for (Operation &op : body)
    if (!isa<TaskOp, BatchOp>(op))
      return op.emitOpError(d.describe() +
                            ": split must come before place and replicate");
  SmallVector<Operation *> perMb, updates;
  for (Operation &op : body) {
    auto t = dyn_cast<TaskOp>(op);
    if (t && t.getTag().isPass(PassKind::U))
      updates.push_back(&op);
    else
      perMb.push_back(&op);
  }
  OpBuilder b = OpBuilder::atBlockEnd(&body);
  int64_t m = d.get<SplitOptions>().microbatches;
  std::vector<IRMapping> maps(m);
  auto cloneFor = [&](Operation *op, int64_t mb) {
    Operation *c = b.clone(*op, maps[mb]);
    auto task = dyn_cast<TaskOp>(c);
    auto batch = dyn_cast<BatchOp>(c);
    TagAttr tag = task ? task.getTag() : batch.getTag();
    c->setAttr("tag", tag.withMicrobatch(mb));
  };
  // Default order (GPipe): every forward, then every backward.
  for (int64_t mb = 0; mb < m; ++mb)
    for (Operation *op : perMb) {
      auto t = dyn_cast<TaskOp>(op);
      if (!t || !t.getTag().isPass(PassKind::B))
        cloneFor(op, mb);
    }
  for (int64_t mb = 0; mb < m; ++mb)
    for (Operation *op : perMb) {
      auto t = dyn_cast<TaskOp>(op);
      if (t && t.getTag().isPass(PassKind::B))
        cloneFor(op, mb);
    }
  for (Operation *op : updates) {
    auto u = cast<TaskOp>(op);
    SmallVector<Value> deps;
    for (Value dep : u.getDeps())
      for (int64_t mb = 0; mb < m; ++mb)
        deps.push_back(maps[mb].lookupOrDefault(dep));
    Operation *c = b.clone(*op);
    cast<TaskOp>(c).getDepsMutable().assign(deps);
  }
  for (Operation *op : llvm::reverse(updates))
    op->erase();
  for (Operation *op : llvm::reverse(perMb))
    op->erase();
  program.setNumMicrobatches(m);
  return success();
}

namespace {
struct SplitPass : mlir::piper::impl::PiperSplitBase<SplitPass> {
  using PiperSplitBase::PiperSplitBase;
  void runOnOperation() override {
    Directive d(SplitOptions{microbatches},
                "piper-split microbatches=" + std::to_string(microbatches));
    if (failed(applyDirective(getOperation(), d, std::nullopt)))
      signalPassFailure();
  }
};
} // namespace
