// piper-split-devices: one device program per device class, transfers
// lowered to send/recv pairs.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERSPLITDEVICES
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

static ArrayRef<int64_t> groupOf(Operation *op) { return devicesOf(op); }

/// Whether a collective moves tensors (rather than summing gradient
/// accumulators in place).
static bool onValues(Operation *op) {
  return isa<CollectiveOpInterface>(op) &&
         llvm::any_of(op->getOperandTypes(),
                      [](Type t) { return !isa<TokenType>(t); });
}

namespace {
/// Splits a program into one piper.device_program per device class: finds
/// the classes, checks that every node runs on one of them, then clones each
/// node into the program of its class, lowering transfers to send/recv pairs.
class DeviceSplitter {
public:
  DeviceSplitter(ModuleOp module, ProgramOp program)
      : module(module), program(program), body(program.getBody().front()) {}

  /// Finds the device classes: the distinct device groups of tasks, which
  /// must not overlap. Fails on a task that is not placed.
  LogicalResult collectClasses();
  /// Creates an empty device program per class before the program, numbered
  /// in the order of the classes' first ranks.
  void createPrograms();
  /// Checks what place guarantees but a hand-written program may break:
  /// transfers run between classes and from their producer's group, and
  /// every task and collective on tensors runs on one class and reads other
  /// groups' values only through transfers.
  LogicalResult checkPlacement();
  /// Clones every node of the program into the device programs that run it.
  LogicalResult cloneNodes();

  /// The device programs, one per class, in class order.
  ArrayRef<DeviceProgramOp> getPrograms() const { return programs; }

private:
  /// The position of device group `g`, which must be a class.
  size_t classOf(ArrayRef<int64_t> g) const {
    return classIndex.at(std::vector<int64_t>(g.begin(), g.end()));
  }
  /// Whether device group `g` is a class.
  bool isClass(ArrayRef<int64_t> g) const {
    return classIndex.count(std::vector<int64_t>(g.begin(), g.end())) > 0;
  }
  /// A builder at the end of class `c`'s device program.
  OpBuilder builderFor(size_t c) {
    return OpBuilder::atBlockEnd(&programs[c].getBody().front());
  }
  /// Checks the placement of one transfer: between two classes, sending a
  /// task's value from the group that produced it.
  LogicalResult checkTransfer(TransferOp tr);
  /// Clones `op` into class `c`, dropping token edges from other classes.
  Operation *cloneInto(Operation *op, size_t c);
  /// Clones the batch into every class that reads it: each loads it itself.
  void cloneBatch(BatchOp batch);
  /// Lowers a transfer to a send in the source class and a receive in the
  /// destination class, on a fresh channel.
  void lowerTransfer(TransferOp tr);
  /// Lowers a ring shift to a send and a receive of one channel in its
  /// class: each member sends to its ring member `offset` ahead and
  /// receives from the one `offset` behind.
  void lowerRingShift(RingShiftOp rs);
  /// Clones a collective over several classes into every class it covers;
  /// fails when it covers part of a class or devices that run no task.
  LogicalResult cloneSpanningCollective(Operation &op,
                                        CollectiveOpInterface ar);

  ModuleOp module;
  ProgramOp program;
  Block &body;
  /// The device classes, in the order tasks first run on them.
  std::vector<std::vector<int64_t>> classes;
  /// Each class's position, which is also its device program's.
  std::map<std::vector<int64_t>, size_t> classIndex;
  SmallVector<DeviceProgramOp> programs;
  /// Per device program, the clones of the program's values.
  std::vector<IRMapping> maps;
  /// The next send/recv channel.
  int64_t channel = 0;
};
} // namespace

LogicalResult DeviceSplitter::collectClasses() {
  std::map<int64_t, size_t> classOfDevice;
  for (Operation &op : body) {
    if (auto t = dyn_cast<TaskOp>(op); t && !t.getDevices())
      return t.emitOpError() << describeNode(t)
                             << " is not placed; run the place directives "
                                "first";
    // Tasks define the classes; an all-reduce may span several (tied
    // parameters).
    if (!isa<TaskOp>(op))
      continue;
    ArrayRef<int64_t> g = groupOf(&op);
    std::vector<int64_t> group(g.begin(), g.end());
    auto it = std::find(classes.begin(), classes.end(), group);
    if (it != classes.end())
      continue;
    for (int64_t d : group)
      if (classOfDevice.count(d))
        return op.emitOpError("device ")
               << d
               << " belongs to two different device groups; every "
                  "device must belong to exactly one group";
    for (int64_t d : group)
      classOfDevice[d] = classes.size();
    classes.push_back(group);
  }
  return success();
}

void DeviceSplitter::createPrograms() {
  std::vector<size_t> byFirstRank(classes.size());
  std::iota(byFirstRank.begin(), byFirstRank.end(), 0);
  std::sort(byFirstRank.begin(), byFirstRank.end(),
            [&](size_t a, size_t b) { return classes[a][0] < classes[b][0]; });
  OpBuilder mb(module.getContext());
  mb.setInsertionPoint(program);
  for (auto [i, c] : llvm::enumerate(byFirstRank)) {
    classIndex[classes[c]] = i;
    programs.push_back(DeviceProgramOp::create(
        mb, program.getLoc(), "class" + std::to_string(i), classes[c], i));
  }
}

LogicalResult DeviceSplitter::checkTransfer(TransferOp tr) {
  if (!isClass(tr.getFrom()) || !isClass(tr.getTo()))
    return tr.emitOpError("moves data between [")
           << tr.getFrom().getMembers() << "] and [" << tr.getTo().getMembers()
           << "], which are not both device groups of tasks";
  Operation *def = tr.getInput().getDefiningOp();
  if (auto producer = dyn_cast_or_null<TaskOp>(def);
      producer && producer.getDevicesAttr() != tr.getFrom())
    return tr.emitOpError("sends from [")
           << tr.getFrom().getMembers() << "] a value produced on ["
           << producer.getNodeDevices() << "]";
  return success();
}

LogicalResult DeviceSplitter::checkPlacement() {
  for (Operation &op : body) {
    if (auto tr = dyn_cast<TransferOp>(op)) {
      if (failed(checkTransfer(tr)))
        return failure();
      continue;
    }
    if (!isa<TaskOp>(op) && !onValues(&op))
      continue;
    ArrayRef<int64_t> g = groupOf(&op);
    if (!isClass(g))
      return op.emitOpError("runs on [")
             << g
             << "], which is not the device group of any task; a "
                "collective on tensors runs over one device group";
    for (Value v : op.getOperands()) {
      if (isa<TokenType>(v.getType()))
        continue;
      Operation *def = v.getDefiningOp();
      if (auto tr = dyn_cast_or_null<TransferOp>(def)) {
        if (tr.getTo().getMembers() != g)
          return op.emitOpError("runs on [")
                 << g << "] but reads a transfer to ["
                 << tr.getTo().getMembers() << "]";
      } else if (def && !isa<BatchOp>(def) && groupOf(def) != g) {
        return op.emitOpError("runs on [")
               << g << "] but reads a value of " << describeNode(def) << " on ["
               << groupOf(def)
               << "] without a transfer; run the place directives";
      }
    }
  }
  return success();
}

Operation *DeviceSplitter::cloneInto(Operation *op, size_t c) {
  OpBuilder b = builderFor(c);
  Operation *clone = b.clone(*op, maps[c]);
  if (auto node = dyn_cast<ProgramNodeOpInterface>(clone)) {
    auto orig = cast<ProgramNodeOpInterface>(op);
    SmallVector<Value> deps;
    for (auto [o, dep] :
         llvm::zip(orig.getNodeDepsMutable(), node.getNodeDepsMutable()))
      if (maps[c].contains(o.get()))
        deps.push_back(dep.get());
    node.getNodeDepsMutable().assign(deps);
  }
  return clone;
}

void DeviceSplitter::cloneBatch(BatchOp batch) {
  std::set<size_t> users;
  for (Operation *user : batch->getUsers())
    if (!groupOf(user).empty())
      users.insert(classOf(groupOf(user)));
  for (size_t c : users)
    cloneInto(batch, c);
}

void DeviceSplitter::lowerTransfer(TransferOp tr) {
  size_t from = classOf(tr.getFrom()), to = classOf(tr.getTo());
  OpBuilder sb = builderFor(from), rb = builderFor(to);
  auto send = SendOp::create(sb, tr.getLoc(), maps[from].lookup(tr.getInput()),
                             ValueRange(), tr.getTo(), channel, tr.getStream());
  auto recv = RecvOp::create(rb, tr.getLoc(), tr.getResult().getType(),
                             rb.getType<TokenType>(), ValueRange(),
                             tr.getFrom(), channel, tr.getStream());
  ++channel;
  maps[from].map(tr.getDone(), send.getDone());
  maps[to].map(tr.getResult(), recv.getResult());
  maps[to].map(tr.getDone(), recv.getDone());
}

void DeviceSplitter::lowerRingShift(RingShiftOp rs) {
  size_t c = classOf(rs.getDevices().getMembers());
  OpBuilder b = builderFor(c);
  MLIRContext *ctx = rs.getContext();
  SmallVector<Value> deps;
  for (Value d : rs.getDeps())
    if (maps[c].contains(d))
      deps.push_back(maps[c].lookup(d));
  auto send =
      SendOp::create(b, rs.getLoc(), maps[c].lookup(rs.getInput()), deps,
                     DeviceGroupAttr::get(ctx, rs.peersAt(rs.getOffset())),
                     channel, rs.getStream());
  auto recv =
      RecvOp::create(b, rs.getLoc(), rs.getResult().getType(),
                     b.getType<TokenType>(), ValueRange{send.getDone()},
                     DeviceGroupAttr::get(ctx, rs.peersAt(-rs.getOffset())),
                     channel, rs.getStream());
  ++channel;
  maps[c].map(rs.getResult(), recv.getResult());
  maps[c].map(rs.getDone(), recv.getDone());
}

LogicalResult
DeviceSplitter::cloneSpanningCollective(Operation &op,
                                        CollectiveOpInterface ar) {
  std::set<int64_t> devices(ar.getDevices().begin(), ar.getDevices().end());
  size_t covered = 0;
  for (auto [c, dp] : llvm::enumerate(programs)) {
    ArrayRef<int64_t> ranks = dp.getRanks();
    bool inside =
        llvm::all_of(ranks, [&](int64_t r) { return devices.count(r) > 0; });
    bool touches =
        llvm::any_of(ranks, [&](int64_t r) { return devices.count(r) > 0; });
    if (touches && !inside)
      return op.emitOpError("spans part of the device group [")
             << ranks << "]; a collective covers whole groups";
    if (inside) {
      cloneInto(&op, c);
      covered += ranks.size();
    }
  }
  if (covered != devices.size())
    return op.emitOpError("names devices that run no task");
  return success();
}

LogicalResult DeviceSplitter::cloneNodes() {
  maps.assign(programs.size(), IRMapping());
  for (Operation &op : body) {
    if (auto batch = dyn_cast<BatchOp>(op)) {
      cloneBatch(batch);
      continue;
    }
    if (auto tr = dyn_cast<TransferOp>(op)) {
      lowerTransfer(tr);
      continue;
    }
    if (auto rs = dyn_cast<RingShiftOp>(op)) {
      lowerRingShift(rs);
      continue;
    }
    if (auto ar = dyn_cast<CollectiveOpInterface>(op);
        ar && !isClass(ar.getDevices())) {
      if (failed(cloneSpanningCollective(op, ar)))
        return failure();
      continue;
    }
    cloneInto(&op, classOf(groupOf(&op)));
  }
  return success();
}

/// A class of several replicas must sum every gradient it accumulates, or
/// its replicas would silently diverge.
static LogicalResult checkGradientsReduced(ModuleOp module,
                                           ArrayRef<DeviceProgramOp> programs) {
  SegmentParams segmentParams(module);
  for (DeviceProgramOp dp : programs) {
    // The members of one tensor-parallel group hold no other copy to sum
    // with (their all-reduces are the layers' own).
    if (dp.getRanks().size() < 2 ||
        static_cast<int64_t>(dp.getRanks().size()) == getMesh(module).getTp())
      continue;
    llvm::DenseSet<StringAttr> reduced;
    dp.walk([&](AllReduceOp ar) {
      for (Attribute a : ar.getParams())
        reduced.insert(cast<FlatSymbolRefAttr>(a).getAttr());
    });
    dp.walk([&](ReduceScatterGradsOp rs) {
      for (Attribute a : rs.getParamRefs())
        reduced.insert(cast<FlatSymbolRefAttr>(a).getAttr());
    });
    // An expert weight split over all of the class's replicas has no other
    // copy to sum with.
    for (ParamOp p : module.getOps<ParamOp>())
      if (std::optional<uint64_t> m = p.getExpertMembers();
          m && static_cast<int64_t>(*m) * getMesh(module).getTp() ==
                   static_cast<int64_t>(dp.getRanks().size()))
        reduced.insert(p.getSymNameAttr());
    for (TaskOp t : dp.getBody().front().getOps<TaskOp>()) {
      ArrayRef<StringAttr> accumulated =
          segmentParams.accumulated(t.getSegment());
      const StringAttr *missing = llvm::find_if(
          accumulated, [&](StringAttr p) { return !reduced.contains(p); });
      StringAttr which = missing != accumulated.end() ? *missing : StringAttr();
      if (which)
        return t.emitOpError()
               << describeNode(t) << " runs on " << dp.getRanks().size()
               << " devices but the gradient of @" << which.getValue()
               << " is never all-reduced; add a replicate directive for its "
                  "stage";
    }
  }
  return success();
}

/// Gradient clipping: one world-wide clip of norm `clip` in `dp`, after its
/// gradients are complete (backward tasks and gradient collectives) and
/// before its updates. Nothing when `dp` has no update task.
static void insertClipGrads(DeviceProgramOp dp, double clip) {
  Block &b = dp.getBody().front();
  SmallVector<TaskOp> updates;
  SmallVector<Value> deps;
  for (Operation &op : b) {
    if (auto t = dyn_cast<TaskOp>(op)) {
      if (t.getTag().isPass(PassKind::U))
        updates.push_back(t);
      else if (t.getTag().isBackward())
        deps.push_back(t.getDone());
    } else if (auto ar = dyn_cast<AllReduceOp>(op)) {
      deps.push_back(ar.getDone());
    } else if (auto rs = dyn_cast<ReduceScatterGradsOp>(op)) {
      deps.push_back(rs.getDone());
    }
  }
  if (updates.empty())
    return;
  OpBuilder cb(updates.front());
  auto c = ClipGradsOp::create(cb, updates.front().getLoc(), deps,
                               cb.getF64FloatAttr(clip));
  for (TaskOp u : updates)
    u.getDepsMutable().append(ValueRange{c.getDone()});
}

LogicalResult mlir::piper::splitDevices(ModuleOp module) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  DeviceSplitter splitter(module, *program);
  if (failed(splitter.collectClasses()))
    return failure();
  splitter.createPrograms();
  if (failed(splitter.checkPlacement()) || failed(splitter.cloneNodes()))
    return failure();
  ArrayRef<DeviceProgramOp> programs = splitter.getPrograms();
  if (failed(checkGradientsReduced(module, programs)))
    return failure();
  OptimizerAttr optimizer = program->getOptimizerAttr();
  double clip = optimizer ? optimizer.getClipGradNorm().convertToDouble() : 0;
  if (clip > 0)
    for (DeviceProgramOp dp : programs)
      insertClipGrads(dp, clip);
  for (DeviceProgramOp dp : programs) {
    if (optimizer)
      dp.setOptimizerAttr(optimizer);
    dp.setNumMicrobatches(program->getNumMicrobatches());
    dp.setNumReplicas(program->getNumReplicas());
  }
  program->erase();
  return success();
}

namespace {
struct SplitDevicesPass
    : mlir::piper::impl::PiperSplitDevicesBase<SplitDevicesPass> {
  void runOnOperation() override {
    if (failed(splitDevices(getOperation())))
      signalPassFailure();
  }
};
} // namespace
