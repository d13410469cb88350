// One lowering for every in-segment collective (docs/compiler.md): after
// placement, `piper-lower-segment-collectives` cuts each segment around the
// segment collectives the axis rewrites left (SegmentCollectiveOpInterface:
// tensor parallelism's g and sequence parallelism's row collectives,
// context parallelism's ring exchanges, all-to-alls and gathers, expert
// parallelism's exchanges), and makes each a program node of its kind over
// its axis's groups of the task's devices, on its axis's stream.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <map>
#include <tuple>

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERLOWERSEGMENTCOLLECTIVES
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

static bool isCollective(Operation &op) {
  return isa<SegmentCollectiveOpInterface>(op);
}

/// Whether `op` reads what a ring exchange passed: the exchange runs beside
/// the work before such an op, which starts a piece of its own.
static bool readsRingExchange(Operation &op) {
  return llvm::any_of(op.getOperands(), [](Value v) {
    auto c = v.getDefiningOp<SegmentCollectiveOpInterface>();
    return c && c.getCollectiveKind() == SegmentCollectiveKind::RingShift;
  });
}

/// Moves each collective on a weight gradient's path (the gathered
/// key/value pieces' reduce-scatter under tensor parallelism,
/// docs/tensor-parallel.md §2b), with everything that reads it, to the end
/// of the segment, in order. Input gradients never read weight gradients,
/// so this keeps the dataflow; cut there, no input-gradient op comes after
/// such a collective, and a split backward (zero-bubble schedules) defers
/// it with the weight gradients instead of making the next piece's BI wait
/// for this piece's BW.
static void sinkWeightGradientCollectives(SegmentOp seg) {
  DenseMap<Operation *, unsigned> weight = weightGradientOps(seg);
  Block &body = seg.getBody().front();
  llvm::SmallPtrSet<Operation *, 16> moved;
  SmallVector<Operation *> order;
  for (Operation &op : body.without_terminator()) {
    bool sink = isCollective(op) && weight.lookup(&op) == 1;
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

/// Tensor parallelism's f (`piper.tp_copy`) is the identity forward, whose
/// gradient rule autodiff has read: it goes. Without the module's
/// tensor-parallel degree, f, g and the sequence-parallel markers are
/// strays (an error).
static LogicalResult eraseTensorParallelCopies(ModuleOp module) {
  if (getMesh(module).getTp() < 2) {
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
  module.walk([](TpCopyOp copy) {
    copy.getResult().replaceAllUsesWith(copy.getInput());
    copy.erase();
  });
  return success();
}

/// Where `c` (a segment collective of a segment task `t` calls) runs: its
/// axis's groups of the task's devices in the module's layout (tp and cp:
/// the layout of `#piper.mesh`; ep: expertGroups of the exchange's
/// members), on the axis's stream. Fails, naming the task, when the task's
/// devices are not whole groups. (A tp collective without the module's
/// degree never gets here: eraseTensorParallelCopies refuses it.)
static FailureOr<CollectiveBinding> bindingOf(ModuleOp module,
                                              ProgramOp program, TaskOp t,
                                              SegmentCollectiveOpInterface c) {
  const MeshAttr mesh = getMesh(module);
  const int64_t tp = mesh.getTp(), cp = mesh.getCp();
  const std::string timesTp =
      tp > 1 ? " (times tensor parallelism " + std::to_string(tp) + ")" : "";
  ArrayRef<int64_t> devices =
      t.getDevices() ? t.getNodeDevices() : ArrayRef<int64_t>();
  const int64_t n = static_cast<int64_t>(devices.size());
  const Axis axis = c.getCollectiveAxis();
  CollectiveBinding binding;
  StringRef stream;
  int64_t whole = 1; // devices in one group of whole groups
  std::string what;  // the groups, for the error
  SmallVector<SmallVector<int64_t>> groups;
  switch (axis) {
  case Axis::tp:
  case Axis::cp:
    if (axis == Axis::cp && cp < 2)
      return c->emitOpError("needs the module's context-parallel degree "
                            "(the cp of piper.mesh, set by context_parallel)");
    whole = axis == Axis::tp ? tp : cp * tp;
    what = axis == Axis::tp
               ? "tensor-parallel groups of " + std::to_string(tp)
               : "context-parallel groups of " + std::to_string(cp) + timesTp;
    if (n > 0 && n % whole == 0)
      groups = layoutGroups(devices, mesh.layout(n), axis);
    stream = axis == Axis::tp ? getTensorParallelStream(module)
                              : getContextParallelStream(module);
    if (axis == Axis::cp)
      binding.overlap = getContextParallelOverlap(module);
    break;
  case Axis::ep: {
    auto exchange = cast<EpExchangeOp>(c.getOperation());
    whole = exchange.getMembers() * tp;
    what = "expert-parallel groups of " +
           std::to_string(exchange.getMembers()) + timesTp;
    if (n > 0)
      groups = expertGroups(devices, exchange.getMembers(), mesh);
    stream = exchange.getStream();
    break;
  }
  default:
    return c->emitOpError("is a collective over the ")
           << axisName(axis) << " axis, which has no in-segment lowering";
  }
  if (groups.empty())
    return t.emitOpError() << describeNode(t) << " runs on "
                           << (n == 0 ? std::string("no device")
                                      : formatDevices(devices))
                           << ", which is not made of whole " << what
                           << "; place its stage on a multiple of " << whole
                           << " devices";
  if (axis != Axis::tp || groups.size() > 1) {
    SmallVector<Attribute> attrs;
    for (ArrayRef<int64_t> g : groups)
      attrs.push_back(DeviceGroupAttr::get(module.getContext(), g));
    binding.subgroups = ArrayAttr::get(module.getContext(), attrs);
  }
  binding.stream = commStream(program, stream);
  return binding;
}

namespace {
/// bindingOf, once per task device group and kind of collective (axis, an
/// exchange's members and stream): commStream walks the program.
class Bindings {
public:
  Bindings(ModuleOp module, ProgramOp program)
      : module(module), program(program) {}

  FailureOr<CollectiveBinding> get(TaskOp t, SegmentCollectiveOpInterface c) {
    Key key{t.getDevicesAttr().getAsOpaquePointer(),
            static_cast<int>(c.getCollectiveAxis()), 0, ""};
    if (auto exchange = dyn_cast<EpExchangeOp>(c.getOperation()))
      key = {std::get<0>(key), std::get<1>(key), exchange.getMembers(),
             exchange.getStream().str()};
    auto it = cache.find(key);
    if (it != cache.end())
      return it->second;
    FailureOr<CollectiveBinding> binding = bindingOf(module, program, t, c);
    if (succeeded(binding))
      cache.emplace(std::move(key), *binding);
    return binding;
  }

private:
  using Key = std::tuple<const void *, int, int64_t, std::string>;
  ModuleOp module;
  ProgramOp program;
  std::map<Key, CollectiveBinding> cache;
};
} // namespace

LogicalResult mlir::piper::lowerSegmentCollectives(ModuleOp module) {
  if (failed(eraseTensorParallelCopies(module)))
    return failure();
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  SymbolTable symbols(module);
  Bindings bindings(module, *program);
  // Every binding first, so that an error leaves the program as it was.
  SmallVector<TaskOp> tasks;
  llvm::MapVector<StringAttr, SegmentOp> segments;
  for (TaskOp t : program->getBody().front().getOps<TaskOp>()) {
    auto seg = symbols.lookup<SegmentOp>(t.getSegment());
    if (!seg || llvm::none_of(seg.getBody().front(), isCollective))
      continue;
    for (auto c : seg.getBody().front().getOps<SegmentCollectiveOpInterface>())
      if (failed(bindings.get(t, c)))
        return failure();
    tasks.push_back(t);
    segments.insert({t.getSegmentAttr().getAttr(), seg});
  }
  llvm::MapVector<StringAttr, SegmentPieces> piecesOf;
  for (auto [name, seg] : segments) {
    hoistAccumulations(seg);
    sinkWeightGradientCollectives(seg);
    FailureOr<SegmentPieces> pieces =
        splitAround(seg, isCollective, symbols, readsRingExchange);
    if (failed(pieces))
      return failure();
    piecesOf[name] = std::move(*pieces);
  }
  for (TaskOp t : tasks)
    splitTaskAtCollectives(
        t, piecesOf[t.getSegmentAttr().getAttr()],
        [&](SegmentCollectiveOpInterface c) { return *bindings.get(t, c); });
  for (auto &entry : piecesOf) {
    for (SegmentOp piece : entry.second.pieces)
      if (soleSegmentCollective(piece))
        symbols.erase(piece);
    symbols.erase(symbols.lookup<SegmentOp>(entry.first));
  }
  return sortTopologically(program->getBody().front());
}

namespace {
struct LowerSegmentCollectivesPass
    : mlir::piper::impl::PiperLowerSegmentCollectivesBase<
          LowerSegmentCollectivesPass> {
  void runOnOperation() override {
    if (failed(lowerSegmentCollectives(getOperation())))
      signalPassFailure();
  }
};
} // namespace
