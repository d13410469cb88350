// Tensor parallelism after placement (docs/tensor-parallel.md §2): the
// `piper-tensor-parallel` pass cuts every segment around the markers the
// `shard_tensor` rewrite and autodiff left (g, sequence parallelism's row
// collectives, the gathered key/value pieces) and makes each a value
// collective over the tensor-parallel groups of its task's devices.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERTENSORPARALLEL
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

/// The markers that become collectives over the tensor-parallel group: g
/// (an all-reduce) and sequence parallelism's all-gathers and
/// reduce-scatters (sp_split stays a kernel: it needs no communication).
static bool isCollectiveMarker(Operation &op) {
  return isSegmentCollective(op, Axis::tp);
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
  int64_t tp = getMesh(module).getTp();
  if (tp < 2) {
    WalkResult stray = module.walk([](Operation *op) {
      if (!isa<TpCopyOp, TpReduceOp, SpAllGatherOp, SpReduceScatterOp,
               SpSplitOp, SpGatherOp>(op))
        return WalkResult::advance();
      op->emitOpError("needs the module's tensor-parallel degree "
                      "(the tp of piper.mesh, set by shard_tensor)");
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
  StreamAttr stream = commStream(*program, getTensorParallelStream(module));
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
    tasks.push_back(
        {t, ArrayAttr::get(
                ctx, deviceGroupAttrs(ctx, devices,
                                      getMesh(module).layout(devices.size()),
                                      Axis::tp))});
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
    splitTaskAtCollectives(t, pieces, t.getDevicesAttr(), stream,
                           chunks.size() > 1 ? chunks : ArrayAttr());
  }
  for (auto &entry : piecesOf) {
    for (SegmentOp piece : entry.second.pieces)
      if (soleSegmentCollective(piece))
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
