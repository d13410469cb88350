// The `place` directive and the piper-place pass: device groups for tasks,
// then transfers on every edge that crosses groups.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERPLACE
#define GEN_PASS_DEF_PIPERFINALIZEPLACEMENT
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

//===----------------------------------------------------------------------===//
// place
//===----------------------------------------------------------------------===//

LogicalResult mlir::piper::checkDevices(Operation *anchor, const Directive &d,
                                        ArrayRef<int64_t> devices,
                                        std::optional<int64_t> worldSize) {
  if (!worldSize)
    return success();
  for (int64_t dev : devices)
    if (dev >= *worldSize)
      return anchor->emitError(d.describe())
             << ": device " << dev << " does not exist (the world has "
             << *worldSize << " devices, 0.." << *worldSize - 1 << ")";
  return success();
}

LogicalResult mlir::piper::applyPlace(ProgramOp program, const Directive &d,
                                      std::optional<int64_t> worldSize) {
  const auto &o = d.get<PlaceOptions>();
  if (failed(checkDevices(program, d, o.devices, worldSize)))
    return failure();
  SmallVector<TaskOp> tasks = matchingTasks(program, d.filter);
  if (tasks.empty())
    return program.emitOpError(d.describe())
           << ": the filter matches no task" << splitPassHint(d.filter);
  MLIRContext *ctx = program.getContext();
  auto group = DeviceGroupAttr::get(ctx, o.devices);
  StreamAttr send = commStream(program, o.stream);
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

/// An update no place directive placed runs where the backward tasks it
/// waits for run: once per device group when a stage's microbatches run on
/// several (a bidirectional pipeline's two copies of the model), each copy
/// waiting for its own group's backward tasks.
static void placeUpdates(ProgramOp program) {
  SmallVector<TaskOp> updates;
  for (TaskOp t : program.getBody().front().getOps<TaskOp>())
    if (t.getTag().isPass(PassKind::U) && !t.getDevices())
      updates.push_back(t);
  for (TaskOp u : updates) {
    llvm::MapVector<Attribute, SmallVector<Value>> depsOn;
    SmallVector<Value> unplaced;
    TaskOp sample;
    for (Value dep : u.getDeps()) {
      auto t = dep.getDefiningOp<TaskOp>();
      if (t && t.getDevicesAttr()) {
        depsOn[t.getDevicesAttr()].push_back(dep);
        sample = t;
      } else {
        unplaced.push_back(dep);
      }
    }
    if (depsOn.empty())
      continue; // reported as unplaced
    OpBuilder b(u);
    b.setInsertionPointAfter(u);
    for (auto [i, entry] : llvm::enumerate(depsOn)) {
      TaskOp copy = i == 0 ? u : cast<TaskOp>(b.clone(*u));
      SmallVector<Value> deps(unplaced);
      deps.append(entry.second.begin(), entry.second.end());
      copy.getDepsMutable().assign(deps);
      copy.setDevicesAttr(cast<DeviceGroupAttr>(entry.first));
      copy.setStreamAttr(computeStream(u.getContext()));
      copy.setSendStreamAttr(sample.getSendStreamAttr());
    }
  }
}

/// A parameter shared by two stages on one device group (a tied embedding
/// whose stages a V layout or DualPipe put together) has one copy there,
/// which both stages' updates would step. The first update on the group
/// keeps its AdamW step, after every backward task of the group that
/// accumulates the parameter; later ones get a copy of their segment
/// without that parameter's update and clearing.
static void dedupeUpdates(ModuleOp module, ProgramOp program) {
  SegmentParams segmentParams(module);
  SymbolTable &symbols = segmentParams.getSymbols();
  Block &body = program.getBody().front();
  DenseMap<Attribute, DenseMap<Attribute, TaskOp>> keeperOn; // group, param
  SmallVector<std::pair<TaskOp, llvm::SmallDenseSet<Attribute>>> drops;
  for (TaskOp u : body.getOps<TaskOp>()) {
    if (!u.getTag().isPass(PassKind::U) || !u.getDevicesAttr())
      continue;
    auto &keepers = keeperOn[u.getDevicesAttr()];
    llvm::SmallDenseSet<Attribute> drop;
    for (StringAttr p : segmentParams.updated(u.getSegment()))
      if (!keepers.try_emplace(p, u).second)
        drop.insert(p);
    if (!drop.empty())
      drops.push_back({u, std::move(drop)});
  }
  if (drops.empty())
    return;
  // Each keeper waits for every accumulation of its dropped parameters on
  // its group.
  for (auto &[u, drop] : drops)
    for (Attribute p : drop) {
      TaskOp keeper = keeperOn[u.getDevicesAttr()][p];
      llvm::SetVector<Value> deps(keeper.getDeps().begin(),
                                  keeper.getDeps().end());
      for (TaskOp t : body.getOps<TaskOp>())
        if (t.getTag().isBackward() &&
            t.getDevicesAttr() == keeper.getDevicesAttr() &&
            llvm::is_contained(segmentParams.accumulated(t.getSegment()),
                               cast<StringAttr>(p)))
          deps.insert(t.getDone());
      keeper.getDepsMutable().assign(deps.getArrayRef());
    }
  for (auto &[u, drop] : drops) {
    auto seg = symbols.lookup<SegmentOp>(u.getSegment());
    OpBuilder b(seg);
    b.setInsertionPointAfter(seg);
    auto copy = cast<SegmentOp>(b.clone(*seg));
    // A fresh name that keeps the pass suffix ("_U") the simulator keys on.
    std::string name = ("shared_" + seg.getSymName()).str();
    for (int i = 1; symbols.lookup(name); ++i)
      name = ("shared" + Twine(i) + "_" + seg.getSymName()).str();
    copy.setSymName(name);
    symbols.insert(copy);
    SmallVector<Operation *> erase;
    copy.walk([&](Operation *op) {
      if (!isa<AdamWOp, ZeroGradOp>(op))
        return;
      auto ref = op->getAttrOfType<FlatSymbolRefAttr>("param");
      if (ref && drop.contains(ref.getAttr()))
        erase.push_back(op);
    });
    for (Operation *op : erase)
      op->erase();
    u.setSegmentAttr(FlatSymbolRefAttr::get(copy.getSymNameAttr()));
  }
}

/// A stage's parameters may have several copies, one per device group that
/// runs some of its microbatches (summed by tieSharedParams), but within a
/// microbatch the forward and backward share one, and every copy has its
/// update.
static LogicalResult checkParameterCopies(ModuleOp module,
                                          ArrayRef<TaskOp> tasks) {
  SegmentParams segmentParams(module);
  DenseMap<std::tuple<StringAttr, int64_t, int64_t>, TaskOp> ownerOf;
  // In first-use order, so that the error below names the same parameter
  // every run (a DenseMap keyed by attribute pointers would not).
  llvm::MapVector<std::pair<StringAttr, int64_t>, SmallVector<TaskOp>> copiesOf;
  DenseSet<std::tuple<StringAttr, int64_t, Attribute>> updatedOn;
  DenseSet<int64_t> stagesWithUpdates;
  for (TaskOp t : tasks) {
    int64_t stage = t.getTag().getPp().value_or(-1);
    bool update = t.getTag().isPass(PassKind::U);
    if (update)
      stagesWithUpdates.insert(stage);
    int64_t mb = t.getTag().getMb().value_or(-1);
    for (StringAttr p : segmentParams.used(t.getSegment())) {
      if (update) {
        updatedOn.insert({p, stage, t.getDevicesAttr()});
        continue;
      }
      auto [it, inserted] = ownerOf.insert({{p, stage, mb}, t});
      if (!inserted && it->second.getDevices() != t.getDevices())
        return t.emitOpError()
               << describeNode(t) << " on " << formatDevices(t.getNodeDevices())
               << " and " << describeNode(it->second) << " on "
               << formatDevices(it->second.getNodeDevices())
               << " both use parameter @" << p.getValue()
               << "; the forward and backward of a stage's microbatch must "
                  "be placed on the same devices";
      SmallVector<TaskOp> &copies = copiesOf[{p, stage}];
      if (llvm::none_of(copies, [&](TaskOp c) {
            return c.getDevicesAttr() == t.getDevicesAttr();
          }))
        copies.push_back(t);
    }
  }
  for (auto &[key, copies] : copiesOf) {
    auto [p, stage] = key;
    if (!stagesWithUpdates.contains(stage))
      continue;
    for (TaskOp t : copies)
      if (!updatedOn.contains({p, stage, t.getDevicesAttr()}))
        return t.emitOpError()
               << describeNode(t) << " on " << formatDevices(t.getNodeDevices())
               << " uses parameter @" << p.getValue()
               << ", but no update of its stage runs there; the forward, "
                  "backward and update of a stage must be placed on the "
                  "same devices";
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
  placeUpdates(*program);
  tasks.assign(body.getOps<TaskOp>().begin(), body.getOps<TaskOp>().end());
  std::set<int64_t> used;
  for (TaskOp t : tasks) {
    if (!t.getDevices())
      return t.emitOpError()
             << describeNode(t) << " is not placed by any place directive";
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
  if (failed(checkParameterCopies(module, tasks)))
    return failure();
  dedupeUpdates(module, *program);
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
      ArrayRef<int64_t> from = producer.getNodeDevices(),
                        to = t.getNodeDevices();
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
        auto tr = TransferOp::create(b, producer.getLoc(), use.get(),
                                     ValueRange(), producer.getDevicesAttr(),
                                     t.getDevicesAttr(), stream);
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
    PlaceOptions o;
    o.devices.assign(devices.begin(), devices.end());
    o.stream = stream;
    if (failed(applyDirective(getOperation(),
                              stageDirective(o, pp, "piper-place"),
                              std::nullopt)))
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

struct FinalizePlacementPass
    : mlir::piper::impl::PiperFinalizePlacementBase<FinalizePlacementPass> {
  using PiperFinalizePlacementBase::PiperFinalizePlacementBase;
  void runOnOperation() override {
    std::optional<int64_t> world;
    if (worldSize > 0)
      world = worldSize;
    if (failed(finalizePlacement(getOperation(), world)))
      signalPassFailure();
  }
};
} // namespace
