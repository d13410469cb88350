// What a program's nodes and segments are, for the rewrites, the lowering
// to plans and the reports: each node's stream and devices, a description
// for diagnostics, and the estimated cost of a segment.
#include "compiler/analysis/ProgramInfo.h"

#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::piper;

StringRef mlir::piper::streamOf(Operation *op) {
  if (auto node = dyn_cast<ProgramNodeOpInterface>(op))
    return node.getNodeStream().getName();
  return "compute";
}

StreamAttr mlir::piper::computeStream(MLIRContext *ctx) {
  return StreamAttr::get(ctx, "compute", StreamKind::compute);
}

ArrayRef<int64_t> mlir::piper::devicesOf(Operation *op) {
  if (auto node = dyn_cast<ProgramNodeOpInterface>(op))
    return node.getNodeDevices();
  return {};
}

std::string mlir::piper::describeNode(Operation *op) {
  std::string out;
  llvm::raw_string_ostream os(out);
  if (auto task = dyn_cast<TaskOp>(op)) {
    os << "task @" << task.getSegment() << " (" << task.getTag().str() << ")";
  } else if (auto ar = dyn_cast<AllReduceOp>(op); ar && ar.getGrads()) {
    os << "all_reduce (" << ar.getTag().str() << ", " << ar.getParams().size()
       << " params)";
  } else if (auto c = dyn_cast<CollectiveOpInterface>(op)) {
    os << op->getName().stripDialect() << " (" << c.getTag().str()
       << ", group [";
    llvm::interleaveComma(c.getDevices().getMembers(), os);
    os << "])";
  } else if (auto b = dyn_cast<BatchOp>(op)) {
    os << "batch (" << b.getTag().str() << ")";
  } else if (auto tr = dyn_cast<TransferOp>(op)) {
    os << "transfer [";
    llvm::interleaveComma(tr.getFrom().getMembers(), os);
    os << "] -> [";
    llvm::interleaveComma(tr.getTo().getMembers(), os);
    os << "]";
  } else if (auto r = dyn_cast<RingShiftOp>(op)) {
    os << "ring_shift (" << r.getTag().str() << ", offset " << r.getOffset()
       << ", group [";
    llvm::interleaveComma(r.getDevices().getMembers(), os);
    os << "])";
  } else if (auto s = dyn_cast<SendOp>(op)) {
    os << "send channel " << s.getChannel();
  } else if (auto r = dyn_cast<RecvOp>(op)) {
    os << "recv channel " << r.getChannel();
  } else if (isa<ClipGradsOp>(op)) {
    os << "clip_grads";
  } else {
    os << op->getName().getStringRef();
  }
  return out;
}

std::string mlir::piper::formatDevices(ArrayRef<int64_t> devices) {
  return "[" +
         llvm::join(llvm::map_range(
                        devices, [](int64_t d) { return std::to_string(d); }),
                    ", ") +
         "]";
}

SegmentCost mlir::piper::estimateSegmentCost(SegmentOp seg) {
  SegmentCost cost;
  seg.walk([&](Operation *op) {
    if (op == seg.getOperation())
      return;
    cost.flops += estimateFlops(op);
    if (auto c = dyn_cast<CostOpInterface>(op))
      cost.bytes += c.getBytesMoved();
    auto perElement = [&](FlatSymbolRefAttr ref, double f, double b) {
      if (auto decl = SymbolTable::lookupNearestSymbolFrom<ParamOp>(op, ref)) {
        double n = decl.getTensorType().getNumElements();
        cost.flops += f * n;
        cost.bytes += b * n;
      }
    };
    if (auto acc = dyn_cast<AccumulateGradOp>(op))
      perElement(acc.getParamAttr(), 1, 12);
    else if (auto adam = dyn_cast<AdamWOp>(op))
      perElement(adam.getParamAttr(), 12, 28);
    else if (auto zero = dyn_cast<ZeroGradOp>(op))
      perElement(zero.getParamAttr(), 0, 4);
  });
  return cost;
}

double mlir::piper::estimateFlops(Operation *op) {
  if (auto cost = dyn_cast<CostOpInterface>(op))
    return cost.getFlops();
  // Structural ops (param_ref, yield, accumulate_grad): their results, as
  // the interface's default counts.
  return countResultElements(op);
}
