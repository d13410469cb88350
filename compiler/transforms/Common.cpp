// Helpers shared by the program rewrites: program lookup, filters,
// topological sorting, communication streams and layout groups (what a
// node is, its stream, devices and cost: compiler/analysis/ProgramInfo).
#include "compiler/transforms/Transforms.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::piper;

FailureOr<ProgramOp> mlir::piper::getProgram(ModuleOp module) {
  ProgramOp found;
  for (auto program : module.getOps<ProgramOp>()) {
    if (found)
      return program.emitOpError(
          "a module must hold exactly one piper.program");
    found = program;
  }
  if (!found)
    return module.emitError("module has no piper.program");
  return found;
}

const SegmentParams::Entry &SegmentParams::get(StringRef segment) {
  auto [it, inserted] = cache.try_emplace(segment);
  if (!inserted)
    return it->second;
  Entry &e = it->second;
  auto seg = symbols.lookup<SegmentOp>(segment);
  if (!seg)
    return e;
  llvm::SetVector<StringAttr> used;
  seg.walk([&](Operation *op) {
    for (NamedAttribute a : op->getAttrs())
      if (auto ref = dyn_cast<FlatSymbolRefAttr>(a.getValue()))
        if (symbols.lookup<ParamOp>(ref.getAttr()))
          used.insert(ref.getAttr());
    if (auto acc = dyn_cast<AccumulateGradOp>(op))
      e.accumulated.push_back(acc.getParamAttr().getAttr());
    else if (auto adam = dyn_cast<AdamWOp>(op))
      e.updated.push_back(adam.getParamAttr().getAttr());
  });
  e.used.assign(used.begin(), used.end());
  return e;
}

bool mlir::piper::matchesFilter(TagAttr tag, const Filter &filter) {
  for (const auto &[key, value] : filter.entries) {
    if (key == "PASS") {
      std::optional<PassKind> pass = tag.getPass();
      if (!pass || (value.kind == FilterValue::Pass &&
                    stringifyPassKind(*pass) != value.pass))
        return false;
      continue;
    }
    std::optional<int64_t> index = tag.getIndex(key);
    if (!index || (value.kind == FilterValue::Index && *index != value.index) ||
        value.kind == FilterValue::Pass)
      return false;
  }
  return true;
}

StreamAttr mlir::piper::commStream(Operation *program, StringRef name) {
  MLIRContext *ctx = program->getContext();
  bool compute = name == "compute";
  program->walk([&](TaskOp task) {
    if (task.getNodeStream().getName() != name)
      return WalkResult::advance();
    compute = true;
    return WalkResult::interrupt();
  });
  return StreamAttr::get(ctx, name,
                         compute ? StreamKind::compute : StreamKind::comm);
}

LogicalResult
mlir::piper::sortTopologically(Block &block,
                               SmallVectorImpl<Operation *> *cycle) {
  // Most rewrites keep the block sorted; then Kahn's algorithm below would
  // return the current order, so there is nothing to do.
  {
    llvm::SmallPtrSet<Operation *, 32> seen;
    bool sorted = true;
    for (Operation &op : block) {
      for (Value v : op.getOperands())
        if (Operation *def = v.getDefiningOp();
            def && def->getBlock() == &block && !seen.contains(def)) {
          sorted = false;
          break;
        }
      if (!sorted)
        break;
      seen.insert(&op);
    }
    if (sorted)
      return success();
  }
  SmallVector<Operation *> ops;
  llvm::DenseMap<Operation *, unsigned> position;
  for (Operation &op : block) {
    position[&op] = ops.size();
    ops.push_back(&op);
  }
  // Kahn's algorithm, always taking the ready op that comes first today.
  std::vector<unsigned> indegree(ops.size(), 0);
  std::vector<SmallVector<unsigned>> users(ops.size());
  for (auto [i, op] : llvm::enumerate(ops)) {
    llvm::SmallSetVector<unsigned, 4> preds;
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp())
        if (def->getBlock() == &block)
          preds.insert(position[def]);
    for (unsigned p : preds) {
      users[p].push_back(i);
      ++indegree[i];
    }
  }
  std::set<unsigned> ready;
  for (unsigned i = 0; i < ops.size(); ++i)
    if (indegree[i] == 0)
      ready.insert(i);
  SmallVector<Operation *> sorted;
  while (!ready.empty()) {
    unsigned i = *ready.begin();
    ready.erase(ready.begin());
    sorted.push_back(ops[i]);
    for (unsigned u : users[i])
      if (--indegree[u] == 0)
        ready.insert(u);
  }
  if (sorted.size() != ops.size()) {
    if (cycle) {
      // Walk predecessors among the unsorted ops until one repeats.
      llvm::DenseSet<Operation *> done(sorted.begin(), sorted.end());
      Operation *cur = nullptr;
      for (Operation *op : ops)
        if (!done.contains(op)) {
          cur = op;
          break;
        }
      llvm::SetVector<Operation *> path;
      while (cur && !path.contains(cur)) {
        path.insert(cur);
        Operation *next = nullptr;
        for (Value v : cur->getOperands())
          if (Operation *def = v.getDefiningOp())
            if (def->getBlock() == &block && !done.contains(def)) {
              next = def;
              break;
            }
        cur = next;
      }
      if (cur) {
        bool on = false;
        for (Operation *op : path) {
          on |= op == cur;
          if (on)
            cycle->push_back(op);
        }
        std::reverse(cycle->begin(), cycle->end());
      }
    }
    return failure();
  }
  for (Operation *op : sorted)
    op->moveBefore(&block, block.end());
  return success();
}

SmallVector<SmallVector<int64_t>>
mlir::piper::layoutGroups(ArrayRef<int64_t> devices,
                          const ParallelLayout &layout, Axis axis) {
  SmallVector<SmallVector<int64_t>> groups;
  for (const std::vector<int64_t> &g : layout.groups(axis))
    groups.emplace_back(llvm::map_range(
        g, [&](int64_t r) { return devices[static_cast<size_t>(r)]; }));
  return groups;
}

SmallVector<SmallVector<int64_t>>
mlir::piper::expertGroups(ArrayRef<int64_t> devices, int64_t members,
                          MeshAttr mesh) {
  int64_t n = devices.size();
  if (n % (members * mesh.getTp()) != 0)
    return {};
  return layoutGroups(devices, mesh.replicaLayout(n, members), Axis::ep);
}

SmallVector<Attribute>
mlir::piper::deviceGroupAttrs(MLIRContext *ctx, ArrayRef<int64_t> devices,
                              const ParallelLayout &layout, Axis axis) {
  SmallVector<Attribute> attrs;
  for (ArrayRef<int64_t> g : layoutGroups(devices, layout, axis))
    attrs.push_back(DeviceGroupAttr::get(ctx, g));
  return attrs;
}

std::string mlir::piper::splitPassHint(const Filter &filter) {
  auto pass = filter.entries.find("PASS");
  if (pass == filter.entries.end() ||
      (pass->second.pass != "BI" && pass->second.pass != "BW"))
    return "";
  return " (BI and BW tasks exist only once an order directive splits the "
         "backward, after place and replicate: select the fused backward "
         "with \"PASS\": \"B\", or the whole stage; docs/schedules.md)";
}

SmallVector<TaskOp> mlir::piper::matchingTasks(ProgramOp program,
                                               const Filter &filter) {
  SmallVector<TaskOp> out;
  for (TaskOp t : program.getBody().front().getOps<TaskOp>())
    if (matchesFilter(t.getTag(), filter))
      out.push_back(t);
  return out;
}

/// For every parameter whose gradient is accumulated on more than one device
/// group (a tied head: the embedding's stage and the head's stage), those
/// groups, in program order (a group whose ZeRO-2/3 reduce-scatters name
/// it counts: they took its accumulation out of the segments).
llvm::MapVector<StringAttr, SmallVector<ArrayRef<int64_t>>>
mlir::piper::sharedParams(SegmentParams &segmentParams, ProgramOp program) {
  llvm::MapVector<StringAttr, SmallVector<ArrayRef<int64_t>>> groups;
  // Every microbatch runs the same segments on the same groups: visit each
  // (segment, group) once. Groups are uniqued attributes, compared by
  // pointer.
  DenseSet<std::pair<Attribute, Attribute>> seen;
  DenseMap<StringAttr, SmallVector<Attribute>> groupAttrs;
  for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
    if (!t.getTag().isBackward() || !t.getDevices())
      continue;
    if (!seen.insert({t.getSegmentAttr(), t.getDevicesAttr()}).second)
      continue;
    for (StringAttr p : segmentParams.accumulated(t.getSegment())) {
      SmallVector<Attribute> &attrs = groupAttrs[p];
      if (llvm::is_contained(attrs, t.getDevicesAttr()))
        continue;
      attrs.push_back(t.getDevicesAttr());
      groups[p].push_back(t.getNodeDevices());
    }
  }
  // ZeRO-2 and 3 take the accumulation out of the backward segments: their
  // reduce-scatters name the parameters of each group instead.
  for (auto rs : program.getBody().front().getOps<ReduceScatterGradsOp>()) {
    for (Attribute a : rs.getParamRefs()) {
      StringAttr p = cast<FlatSymbolRefAttr>(a).getAttr();
      SmallVector<Attribute> &attrs = groupAttrs[p];
      if (llvm::is_contained(attrs, rs.getDevicesAttr()))
        continue;
      attrs.push_back(rs.getDevicesAttr());
      groups[p].push_back(rs.getDevices().getMembers());
    }
  }
  llvm::MapVector<StringAttr, SmallVector<ArrayRef<int64_t>>> shared;
  for (auto &[p, list] : groups)
    if (list.size() > 1)
      shared[p] = list;
  return shared;
}

Directive mlir::piper::stageDirective(Directive::Options options, int64_t pp,
                                      StringRef passName) {
  Filter filter;
  filter.entries["PP"] = {FilterValue::Index, pp, ""};
  return Directive(std::move(options),
                   (passName + " pp=" + std::to_string(pp)).str(), filter);
}
