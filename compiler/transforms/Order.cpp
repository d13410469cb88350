// The `order` directive and the piper-order pass: token edges that fix the
// order of a stage's tasks.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

#include <map>

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERORDER
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

//===----------------------------------------------------------------------===//
// order
//===----------------------------------------------------------------------===//

namespace {
/// The tasks of a program indexed by the tag values a filter names. An order
/// directive has a filter per (microbatch, pass) of its stage; scanning every
/// task for each of them made a schedule quadratic in the microbatches.
class TaskIndex {
public:
  explicit TaskIndex(ProgramOp program) : block(program.getBody().front()) {}

  /// The tasks `filter` matches, in program order.
  ArrayRef<TaskOp> lookup(const Filter &filter) {
    // Tasks are bucketed by the filter's keys (and which of them are "*"),
    // one scan of the program per such shape, then found by the values it
    // asks for (a pass by its kind; "*" as 0).
    std::string shape;
    Key values;
    for (const auto &[key, value] : filter.entries) {
      shape += key + (value.kind == FilterValue::Any ? "*," : "=,");
      if (value.kind == FilterValue::Index)
        values.push_back(value.index);
      else if (value.kind == FilterValue::Any)
        values.push_back(0);
      else if (std::optional<PassKind> pass = symbolizePassKind(value.pass))
        values.push_back(static_cast<int64_t>(*pass));
      else
        return {};
    }
    auto [it, inserted] = byShape.try_emplace(shape);
    if (inserted) {
      Key key;
      for (TaskOp t : block.getOps<TaskOp>())
        if (taskKey(t.getTag(), filter, key))
          it->second[key].push_back(t);
    }
    auto found = it->second.find(values);
    if (found == it->second.end())
      return {};
    return found->second;
  }

private:
  using Key = SmallVector<int64_t, 4>;
  /// The values of `tag` at the filter's keys into `out`; false when it
  /// does not have them all.
  static bool taskKey(TagAttr tag, const Filter &filter, Key &out) {
    out.clear();
    for (const auto &[key, value] : filter.entries) {
      std::optional<int64_t> v;
      if (key == "PASS") {
        if (std::optional<PassKind> pass = tag.getPass())
          v = static_cast<int64_t>(*pass);
      } else {
        v = tag.getIndex(key);
      }
      if (!v)
        return false;
      out.push_back(value.kind == FilterValue::Any ? 0 : *v);
    }
    return true;
  }

  Block &block;
  llvm::StringMap<std::map<Key, SmallVector<TaskOp>>> byShape;
};
} // namespace

/// An overlap slot: the tasks of its k-th filter run on compute stream
/// "compute.k" ("compute" for the first), so that the executor runs them
/// concurrently, except that a member accumulating the gradient of a
/// parameter that an earlier member accumulates joins that member's stream:
/// two accumulations into one buffer must not race.
static void assignOverlapStreams(ArrayRef<SmallVector<TaskOp>> members,
                                 SegmentParams &segmentParams) {
  SmallVector<std::pair<StreamAttr, llvm::SmallDenseSet<Attribute>>> used;
  for (auto [k, tasks] : llvm::enumerate(members)) {
    if (tasks.empty())
      continue;
    llvm::SmallDenseSet<Attribute> params;
    for (TaskOp t : tasks)
      for (StringAttr p : segmentParams.accumulated(TaskOp(t).getSegment()))
        params.insert(p);
    StreamAttr stream = TaskOp(tasks.front()).getStreamAttr();
    if (!stream || !stream.isCompute())
      continue;
    if (k > 0)
      stream = StreamAttr::get(stream.getContext(),
                               (stream.getName() + "." + Twine(k)).str(),
                               StreamKind::compute);
    for (auto &[earlier, earlierParams] : used)
      if (llvm::any_of(params,
                       [&](Attribute p) { return earlierParams.contains(p); }))
        stream = earlier;
    for (TaskOp t : tasks)
      TaskOp(t).setStreamAttr(stream);
    used.push_back({stream, std::move(params)});
  }
}

/// Splits the fused backward tasks that the directive's "BI" filters name
/// (with PASS "B" instead) into BI and BW tasks. The verifier has checked that
/// each such filter has its "BW" in a later group.
static LogicalResult splitRequestedBackwards(ProgramOp program,
                                             const Directive &d) {
  llvm::SetVector<Operation *> fused;
  TaskIndex index(program);
  for (const std::vector<Filter> &group : d.get<OrderOptions>().groups)
    for (const Filter &f : group) {
      auto pass = f.entries.find("PASS");
      if (pass == f.entries.end() || pass->second.pass != "BI")
        continue;
      Filter base = f;
      base.entries["PASS"].pass = "B";
      for (TaskOp t : index.lookup(base))
        fused.insert(t);
    }
  SmallVector<TaskOp> tasks;
  for (Operation *op : fused)
    tasks.push_back(cast<TaskOp>(op));
  return splitBackwardTasks(program, tasks);
}

namespace {
/// The token dependencies one order directive appended: per task, the
/// values added at the end of its deps.
using AddedDeps = SmallVector<std::pair<TaskOp, SmallVector<Value>>>;
} // namespace

/// An order directive's tasks and token edges (each group's tasks wait for
/// the previous group's), without the sort that puts the program in their
/// order; the edges added go to `added`.
static LogicalResult addOrderEdges(ProgramOp program, const Directive &d,
                                   AddedDeps &added) {
  if (failed(splitRequestedBackwards(program, d)))
    return failure();
  SmallVector<SmallVector<TaskOp>> groups;
  std::optional<ArrayRef<int64_t>> devices;
  TaskOp first;
  TaskIndex index(program);
  SegmentParams segmentParams(program->getParentOfType<ModuleOp>());
  for (auto [gi, group] : llvm::enumerate(d.get<OrderOptions>().groups)) {
    llvm::SetVector<Operation *> tasks;
    SmallVector<SmallVector<TaskOp>> members;
    for (const Filter &f : group) {
      members.emplace_back();
      for (TaskOp t : index.lookup(f))
        if (tasks.insert(t))
          members.back().push_back(t);
    }
    if (group.size() > 1)
      assignOverlapStreams(members, segmentParams);
    if (tasks.empty()) {
      std::string filters;
      for (const Filter &f : group)
        filters += (filters.empty() ? "" : ", ") + f.str();
      return program.emitOpError(d.describe())
             << ": group " << gi << " [" << filters << "] matches no task";
    }
    SmallVector<TaskOp> ts;
    for (Operation *op : tasks) {
      auto t = cast<TaskOp>(op);
      if (t.getDevices()) {
        if (!devices) {
          devices = t.getNodeDevices();
          first = t;
        } else if (*devices != t.getNodeDevices()) {
          return t.emitOpError(d.describe())
                 << ": an order directive must cover one device group, but "
                 << describeNode(first) << " runs on "
                 << formatDevices(*devices) << " and " << describeNode(t)
                 << " on " << formatDevices(t.getNodeDevices());
        }
      }
      ts.push_back(t);
    }
    groups.push_back(std::move(ts));
  }
  for (size_t g = 0; g + 1 < groups.size(); ++g)
    for (TaskOp next : groups[g + 1]) {
      llvm::SetVector<Value> deps(next.getDeps().begin(), next.getDeps().end());
      size_t before = deps.size();
      for (TaskOp prev : groups[g])
        if (prev != next)
          deps.insert(prev.getDone());
      if (deps.size() == before)
        continue;
      added.push_back(
          {next, SmallVector<Value>(deps.getArrayRef().drop_front(before))});
      next.getDepsMutable().assign(deps.getArrayRef());
    }
  return success();
}

/// Sorts the program after order directive `d`'s edges, or says which cycle
/// they close.
static LogicalResult sortAfterOrder(ProgramOp program, const Directive &d) {
  SmallVector<Operation *> cycle;
  if (succeeded(sortTopologically(program.getBody().front(), &cycle)))
    return success();
  std::string path;
  for (Operation *op : cycle)
    path += describeNode(op) + " -> ";
  if (!cycle.empty())
    path += describeNode(cycle.front());
  return program.emitOpError(d.describe())
         << ": the order contradicts the dataflow and creates a cycle: "
         << path;
}

LogicalResult mlir::piper::applyOrder(ProgramOp program, const Directive &d) {
  return applyOrders(program, {&d});
}

LogicalResult mlir::piper::applyOrders(ProgramOp program,
                                       ArrayRef<const Directive *> ds) {
  // Every directive's edges, then one sort: a sort visits the whole
  // program, and a schedule has an order directive per device group
  // (docs/compiler.md, many stages).
  std::vector<AddedDeps> added(ds.size());
  for (size_t i = 0; i < ds.size(); ++i)
    if (failed(addOrderEdges(program, *ds[i], added[i])))
      return failure();
  if (succeeded(sortTopologically(program.getBody().front())))
    return success();
  // A cycle: the first directive that closes one, as if each were sorted
  // after its own edges. Take every directive's edges out, then put them
  // back one directive at a time.
  for (size_t i = ds.size(); i-- > 0;)
    for (auto &[task, values] : llvm::reverse(added[i])) {
      SmallVector<Value> deps(task.getDeps());
      deps.truncate(deps.size() - values.size());
      task.getDepsMutable().assign(deps);
    }
  for (size_t i = 0; i < ds.size(); ++i) {
    for (auto &[task, values] : added[i]) {
      SmallVector<Value> deps(task.getDeps());
      deps.append(values.begin(), values.end());
      task.getDepsMutable().assign(deps);
    }
    if (failed(sortAfterOrder(program, *ds[i])))
      return failure();
  }
  return program.emitOpError("order directives: the program cannot be "
                             "sorted, though each directive's order can");
}

namespace {
struct OrderPass : mlir::piper::impl::PiperOrderBase<OrderPass> {
  using PiperOrderBase::PiperOrderBase;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    llvm::Expected<Strategy> strategy = readStrategyFile(file, "order file");
    if (!strategy) {
      module.emitError(llvm::toString(strategy.takeError()));
      return signalPassFailure();
    }
    FailureOr<ProgramOp> program = getProgram(module);
    if (failed(program))
      return signalPassFailure();
    for (const Directive &d : strategy->directives) {
      if (d.kind() != Directive::Order) {
        module.emitError(d.describe())
            << ": piper-order applies order directives only (use "
               "piper-apply-strategy for a whole strategy)";
        return signalPassFailure();
      }
      if (failed(applyOrder(*program, d)))
        return signalPassFailure();
    }
  }
};
} // namespace
