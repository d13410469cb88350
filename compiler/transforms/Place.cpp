// The `place` directive and the piper-place pass: device groups for tasks,
// then transfers on every edge that crosses groups.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERPLACE
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

//===----------------------------------------------------------------------===//
// place
//===----------------------------------------------------------------------===//

LogicalResult mlir::piper::checkDevices(Operation *anchor, const Directive &d,
                                  std::optional<int64_t> worldSize) {
  if (!worldSize)
    return success();
  for (int64_t dev : d.devices)
    if (dev >= *worldSize)
      return anchor->emitError(d.describe())
             << ": device " << dev << " does not exist (the world has "
             << *worldSize << " devices, 0.." << *worldSize - 1 << ")";
  return success();
}

LogicalResult mlir::piper::applyPlace(ProgramOp program, const Directive &d,
                                std::optional<int64_t> worldSize) {
  if (failed(checkDevices(program, d, worldSize)))
    return failure();
  SmallVector<TaskOp> tasks = matchingTasks(program, d.filter);
  if (tasks.empty())
    return program.emitOpError(d.describe()) << ": the filter matches no task";
  MLIRContext *ctx = program.getContext();
  auto group = DeviceGroupAttr::get(ctx, d.devices);
  StreamAttr send = commStream(program, d.stream);
  for (TaskOp t : tasks) {
    if (auto prev = t.getDevicesAttr(); prev && prev != group)
      return t.emitOpError(d.describe())
             << ": overlapping placements: " << describeNode(t)
             << " is already placed on " << formatDevices(prev.getMembers());
    t.setDevicesAttr(group);
    if (!t.getStreamAttr())
      t.setStreamAttr(computeStream(ctx));
    t.setSendStreamAttr(send);
  }
  return success();
}

LogicalResult mlir::piper::finalizePlacement(ModuleOp module,
                                             std::optional<int64_t> worldSize) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  Block &body = program->getBody().front();
  MLIRContext *ctx = module.getContext();
  SmallVector<TaskOp> tasks(body.getOps<TaskOp>());
  if (llvm::none_of(tasks, [](TaskOp t) { return t.getDevices(); }))
    for (TaskOp t : tasks) {
      t.setDevicesAttr(DeviceGroupAttr::get(ctx, {0}));
      t.setStreamAttr(computeStream(ctx));
    }
  std::set<int64_t> used;
  for (TaskOp t : tasks) {
    if (!t.getDevices())
      return t.emitOpError() << describeNode(t)
                             << " is not placed by any place directive";
    used.insert(t.getNodeDevices().begin(), t.getNodeDevices().end());
  }
  {
    int64_t world = worldSize ? *worldSize : *used.rbegin() + 1;
    SmallVector<int64_t> idle;
    for (int64_t d = 0; d < world; ++d)
      if (!used.count(d))
        idle.push_back(d);
    if (!idle.empty())
      return program->emitOpError("devices ")
             << formatDevices(idle) << " of the " << world
             << "-device world run no task";
  }
  // Within a stage, a parameter lives on one device group: the forward that
  // reads it, the backward that accumulates its gradient and the update
  // must share it. (Different stages may each hold a copy: a tied head.)
  SegmentParams segmentParams(module);
  DenseMap<std::pair<StringAttr, int64_t>, TaskOp> ownerOf;
  for (TaskOp t : tasks) {
    int64_t stage = t.getTag().getPp().value_or(-1);
    for (StringAttr p : segmentParams.used(t.getSegment())) {
      auto [it, inserted] = ownerOf.insert({{p, stage}, t});
      if (!inserted && it->second.getDevices() != t.getDevices())
        return t.emitOpError()
               << describeNode(t) << " on " << formatDevices(t.getNodeDevices())
               << " and " << describeNode(it->second) << " on "
               << formatDevices(it->second.getNodeDevices())
               << " both use parameter @" << p.getValue()
               << "; the forward, backward and update of a stage must be "
                  "placed on the same devices";
    }
  }
  // A transfer on every data edge between different device groups (token
  // edges only order, so they need none).
  OpBuilder b(module.getContext());
  DenseMap<std::pair<Value, Attribute>, Value> transferred;
  for (TaskOp t : tasks) {
    for (OpOperand &use : t->getOpOperands()) {
      auto producer = use.get().getDefiningOp<TaskOp>();
      if (!producer || producer.getDevices() == t.getDevices() ||
          isa<TokenType>(use.get().getType()))
        continue;
      ArrayRef<int64_t> from = producer.getNodeDevices(), to = t.getNodeDevices();
      if (from.size() != to.size())
        return t.emitOpError()
               << describeNode(t) << " on " << formatDevices(to)
               << " consumes a value of " << describeNode(producer) << " on "
               << formatDevices(from)
               << "; transfers need device groups of the same size";
      auto key = std::make_pair(use.get(), Attribute(t.getDevicesAttr()));
      Value &moved = transferred[key];
      if (!moved) {
        b.setInsertionPointAfter(producer);
        StreamAttr stream = producer.getSendStreamAttr();
        if (!stream)
          stream = commStream(*program, "pp_stream");
        auto tr = TransferOp::create(
            b, producer.getLoc(), use.get(), ValueRange(),
            producer.getDevicesAttr(), t.getDevicesAttr(), stream);
        moved = tr.getResult();
      }
      use.set(moved);
    }
  }
  return sortTopologically(body);
}

namespace {
struct PlacePass : mlir::piper::impl::PiperPlaceBase<PlacePass> {
  using PiperPlaceBase::PiperPlaceBase;
  void runOnOperation() override {
    Directive d =
        stageDirective(Directive::Place, pp, devices, "piper-place");
    d.stream = stream;
    if (failed(verifyDeviceGroup(devices, "piper-place devices", [&] {
          return getOperation().emitError();
        })))
      return signalPassFailure();
    if (failed(applyDirective(getOperation(), d, std::nullopt)))
      return signalPassFailure();
    // Transfers are inserted once the last stage has been placed.
    FailureOr<ProgramOp> program = getProgram(getOperation());
    bool allPlaced = true;
    for (TaskOp t : program->getBody().front().getOps<TaskOp>())
      allPlaced &= bool(t.getDevices());
    if (allPlaced && failed(finalizePlacement(getOperation(), std::nullopt)))
      signalPassFailure();
  }
};
} // namespace
