// Helpers shared by the program rewrites: program lookup, filters,
// topological sorting, communication streams and layout groups (what a
// node is, its stream, devices and cost: compiler/analysis/ProgramInfo).
#include "compiler/transforms/Transforms.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

#include <queue>

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
  // Kahn's algorithm by position takes the ops before the first one with a
  // producer at or after it in their order (each is ready, and comes first,
  // when its turn comes), so only the rest is sorted; most rewrites keep the
  // block sorted and leave nothing. A program has 10^5 ops, re-sorted after
  // each schedule and replicate directive: the search compiles hundreds of
  // them (docs/search.md), so arrays here, not a set or a vector per op.
  // Whether a producer comes first is the block's own order (one
  // renumbering, then a comparison); only the ops from `first` on are
  // numbered here.
  auto producerIn = [&](Value v) -> Operation * {
    Operation *def = v.getDefiningOp();
    return def && def->getBlock() == &block ? def : nullptr;
  };
  SmallVector<Operation *> ops;
  unsigned first = ~0u;
  for (Operation &op : block) {
    if (first == ~0u)
      for (Value v : op.getOperands())
        if (Operation *def = producerIn(v);
            def && (def == &op || !def->isBeforeInBlock(&op))) {
          first = ops.size();
          break;
        }
    ops.push_back(&op);
  }
  if (first == ~0u)
    return success();
  // The ops from `first` on, numbered from 0 (a producer missing from
  // `position` comes before them): each one's producers among them
  // (without repeats) and users, as arrays.
  const unsigned n = ops.size() - first;
  llvm::DenseMap<Operation *, unsigned> position;
  position.reserve(n);
  for (unsigned i = 0; i < n; ++i)
    position[ops[first + i]] = first + i;
  std::vector<unsigned> indegree(n, 0), lastUser(n, ~0u), userStart(n + 1, 0);
  std::vector<std::pair<unsigned, unsigned>> edges;
  for (unsigned i = 0; i < n; ++i)
    for (Value v : ops[first + i]->getOperands())
      if (Operation *def = producerIn(v)) {
        auto at = position.find(def);
        if (at == position.end())
          continue; // before `first`
        unsigned p = at->second;
        if (lastUser[p - first] == i)
          continue;
        lastUser[p - first] = i;
        edges.push_back({p - first, i});
        ++indegree[i];
        ++userStart[p - first + 1];
      }
  for (unsigned i = 0; i < n; ++i)
    userStart[i + 1] += userStart[i];
  std::vector<unsigned> users(edges.size()),
      fill(userStart.begin(), userStart.end() - 1);
  for (auto [p, u] : edges)
    users[fill[p]++] = u;
  // Always the ready op that comes first today. A cursor walks the ops in
  // their order; an op that becomes ready behind it (its producers came
  // after it) waits in a heap, and every op there comes before the cursor,
  // so the heap goes first. Only ops out of order pass through the heap.
  std::priority_queue<unsigned, std::vector<unsigned>, std::greater<unsigned>>
      late;
  std::vector<unsigned> sorted;
  sorted.reserve(n);
  unsigned cursor = 0;
  while (true) {
    unsigned i;
    if (!late.empty()) {
      i = late.top();
      late.pop();
    } else {
      while (cursor < n && indegree[cursor] != 0)
        ++cursor;
      if (cursor == n)
        break;
      i = cursor++;
    }
    sorted.push_back(i);
    for (unsigned k = userStart[i]; k < userStart[i + 1]; ++k)
      if (--indegree[users[k]] == 0 && users[k] < cursor)
        late.push(users[k]);
  }
  if (sorted.size() != n) {
    if (cycle) {
      // Walk producers among the unsorted ops until one repeats.
      std::vector<bool> done(n, false);
      for (unsigned i : sorted)
        done[i] = true;
      auto unsorted = [&](Operation *op) {
        auto at = position.find(op);
        return at != position.end() && !done[at->second - first];
      };
      Operation *cur = nullptr;
      for (unsigned i = 0; i < n && !cur; ++i)
        if (!done[i])
          cur = ops[first + i];
      llvm::SetVector<Operation *> path;
      while (cur && !path.contains(cur)) {
        path.insert(cur);
        Operation *next = nullptr;
        for (Value v : cur->getOperands())
          if (Operation *def = producerIn(v); def && unsorted(def)) {
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
  // Ops already in their place stay; the others move to the end in order.
  unsigned k = 0;
  while (k < n && sorted[k] == k)
    ++k;
  for (; k < n; ++k)
    ops[first + sorted[k]]->moveBefore(&block, block.end());
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
