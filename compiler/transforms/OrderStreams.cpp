// piper-order-streams: the issue order of each device program. Whether the
// programs together finish a step (no deadlock across devices) is decided
// once, on the plans they lower to, by the plan simulator: lowerToPlans
// (compiler/lowering) runs it, so the compiler and piper-plan share one
// cross-device progress model (docs/compiler.md, "One progress model").
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERORDERSTREAMS
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

/// Orders one device program: tasks keep their (schedule) order; a receive
/// or batch goes right before its first consuming task (a ring shift's
/// receive right after its send), a send or collective right after its
/// last producing task. Issuing communication in
/// compute order is what keeps blocking receives from deadlocking.
static LogicalResult orderProgram(DeviceProgramOp dp) {
  Block &body = dp.getBody().front();
  DenseMap<Operation *, double> key;
  int64_t index = 0;
  for (TaskOp t : body.getOps<TaskOp>())
    key[t] = 3.0 * index++ + 1;
  for (Operation &op : body) {
    if (isa<RecvOp, BatchOp>(op)) {
      double k = 3.0 * index;
      for (Operation *user : op.getUsers())
        if (key.count(user) && isa<TaskOp>(user))
          k = std::min(k, key[user] - 1);
      key[&op] = k;
    }
  }
  for (Operation &op : body) {
    if (isa<SendOp, ClipGradsOp, CollectiveOpInterface>(op)) {
      double k = 0;
      for (Value v : op.getOperands())
        if (Operation *def = v.getDefiningOp(); def && key.count(def))
          k = std::max(k, key[def] + 1);
      key[&op] = k;
    }
  }
  // A receive paired with this device's own send (a ring shift: the send
  // to the next member, then the receive from the previous) goes right
  // after it, so the exchange is issued as soon as its input exists, not
  // when the task that reads it is next.
  for (auto recv : body.getOps<RecvOp>())
    for (Value v : recv->getOperands())
      if (auto send = v.getDefiningOp<SendOp>())
        key[recv] = key[send] + 0.5;
  // Stable sort by key, then repair any edge the keys got wrong.
  SmallVector<Operation *> ops;
  for (Operation &op : body)
    ops.push_back(&op);
  std::stable_sort(ops.begin(), ops.end(), [&](Operation *a, Operation *b) {
    return key.lookup(a) < key.lookup(b);
  });
  for (Operation *op : ops)
    op->moveBefore(&body, body.end());
  return sortTopologically(body);
}

LogicalResult mlir::piper::orderStreams(ModuleOp module) {
  SmallVector<DeviceProgramOp> programs(module.getOps<DeviceProgramOp>());
  if (programs.empty())
    return module.emitError("no device programs: run piper-split-devices "
                            "first");
  for (DeviceProgramOp dp : programs)
    if (failed(orderProgram(dp)))
      return dp.emitOpError("has a cycle between its nodes");
  return success();
}

namespace {
struct OrderStreamsPass
    : mlir::piper::impl::PiperOrderStreamsBase<OrderStreamsPass> {
  void runOnOperation() override {
    if (failed(orderStreams(getOperation())))
      signalPassFailure();
  }
};
} // namespace
