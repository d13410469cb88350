// piper-order-streams: the issue order of each device program, and a
// simulation of all device programs that turns a deadlock into an error.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "llvm/ADT/StringExtras.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERORDERSTREAMS
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

/// Orders one device program: tasks keep their (schedule) order; a receive
/// or batch goes right before its first consuming task, a send or
/// collective right after its last producing task. Issuing communication in
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

/// The id of a collective that spans several device classes.
static std::optional<int64_t> collectiveOf(Operation *op) {
  if (auto c = dyn_cast<CollectiveOpInterface>(op))
    if (std::optional<uint64_t> id = c.getCollective())
      return static_cast<int64_t>(*id);
  return std::nullopt;
}

namespace {
/// Simulates the device programs with blocking receives, asynchronous sends
/// and collectives that complete when their group reaches them.
class Simulator {
public:
  explicit Simulator(MutableArrayRef<DeviceProgramOp> programs)
      : programs(programs) {
    for (auto [c, dp] : llvm::enumerate(this->programs))
      for (Operation &op : dp.getBody().front()) {
        streams[c][streamOf(&op).str()].push_back(&op);
        if (auto s = dyn_cast<SendOp>(op))
          sendOfChannel[s.getChannel()] = &op;
        if (isa<ClipGradsOp>(op))
          ++numClips;
        if (std::optional<int64_t> id = collectiveOf(&op))
          ++membersOf[*id];
      }
  }

  LogicalResult run() {
    size_t total = 0;
    for (auto &[c, ss] : streams)
      for (auto &[name, list] : ss)
        total += list.size();
    while (done.size() < total) {
      bool progress = false;
      for (auto &[c, ss] : streams)
        for (auto &[name, list] : ss) {
          size_t &pc = pcs[{c, name}];
          while (pc < list.size() && ready(list[pc])) {
            done.insert(list[pc++]);
            progress = true;
          }
        }
      if (!progress)
        return report();
    }
    return success();
  }

private:
  bool ready(Operation *op) {
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp(); def && !done.contains(def))
        return false;
    if (auto r = dyn_cast<RecvOp>(op)) {
      Operation *send = sendOfChannel.lookup(r.getChannel());
      return send && done.contains(send);
    }
    // A collective over several classes completes once all of them reach it.
    if (std::optional<int64_t> id = collectiveOf(op)) {
      arrivedAt[*id].insert(op);
      return arrivedAt[*id].size() == membersOf[*id];
    }
    // A world collective completes once every device program reached its own.
    if (isa<ClipGradsOp>(op)) {
      arrivedClips.insert(op);
      return arrivedClips.size() == numClips;
    }
    return true;
  }

  LogicalResult report() {
    std::string msg = "the schedule deadlocks:";
    for (auto &[c, ss] : streams)
      for (auto &[name, list] : ss) {
        size_t pc = pcs[{c, name}];
        if (pc >= list.size())
          continue;
        Operation *op = list[pc];
        DeviceProgramOp dp = programs[c];
        msg += "\n  ranks [" +
               llvm::join(llvm::map_range(dp.getRanks(),
                                          [](int64_t r) {
                                            return std::to_string(r);
                                          }),
                          ", ") +
               "] stream '" + name + "' waits at " + describeNode(op);
        if (auto r = dyn_cast<RecvOp>(op))
          msg += " for a send that never happens";
        else if (isa<ClipGradsOp>(op) && arrivedClips.contains(op))
          msg += " for the other devices to reach their gradient clipping";
        else
          for (Value v : op->getOperands())
            if (Operation *def = v.getDefiningOp();
                def && !done.contains(def)) {
              msg += " for " + describeNode(def);
              break;
            }
      }
    return programs.front().emitError(msg);
  }

  MutableArrayRef<DeviceProgramOp> programs;
  std::map<size_t, std::map<std::string, std::vector<Operation *>>> streams;
  std::map<std::pair<size_t, std::string>, size_t> pcs;
  DenseMap<int64_t, Operation *> sendOfChannel;
  DenseSet<Operation *> done;
  DenseSet<Operation *> arrivedClips;
  size_t numClips = 0;
  std::map<int64_t, size_t> membersOf;
  std::map<int64_t, DenseSet<Operation *>> arrivedAt;
};
} // namespace

LogicalResult mlir::piper::orderStreams(ModuleOp module) {
  SmallVector<DeviceProgramOp> programs(module.getOps<DeviceProgramOp>());
  if (programs.empty())
    return module.emitError("no device programs: run piper-split-devices "
                            "first");
  for (DeviceProgramOp dp : programs)
    if (failed(orderProgram(dp)))
      return dp.emitOpError("has a cycle between its nodes");
  return Simulator(programs).run();
}

namespace {
struct OrderStreamsPass : mlir::piper::impl::PiperOrderStreamsBase<OrderStreamsPass> {
  void runOnOperation() override {
    if (failed(orderStreams(getOperation())))
      signalPassFailure();
  }
};
} // namespace
