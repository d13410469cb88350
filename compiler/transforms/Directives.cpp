// The split, place, replicate and order directives, and whole strategies.
#include "compiler/transforms/Transforms.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

using namespace mlir;
using namespace mlir::piper;

static std::string formatDevices(ArrayRef<int64_t> devices) {
  return "[" +
         llvm::join(llvm::map_range(devices,
                                    [](int64_t d) { return std::to_string(d); }),
                    ", ") +
         "]";
}

static SmallVector<TaskOp> matchingTasks(ProgramOp program,
                                         const Filter &filter) {
  SmallVector<TaskOp> out;
  for (TaskOp t : program.getBody().front().getOps<TaskOp>())
    if (matchesFilter(t.getTag(), filter))
      out.push_back(t);
  return out;
}

//===----------------------------------------------------------------------===//
// split
//===----------------------------------------------------------------------===//

static LogicalResult applySplit(ProgramOp program, const Directive &d) {
  Block &body = program.getBody().front();
  if (program.getNumMicrobatches() != 1 ||
      llvm::any_of(body.getOps<TaskOp>(),
                   [](TaskOp t) { return t.getTag().getMb(); }))
    return program.emitOpError(d.describe() + ": the program is already split");
  for (Operation &op : body)
    if (!isa<TaskOp, BatchOp>(op))
      return op.emitOpError(d.describe() +
                            ": split must come before place and replicate");
  SmallVector<Operation *> perMb, updates;
  for (Operation &op : body) {
    auto t = dyn_cast<TaskOp>(op);
    if (t && t.getTag().isPass(PassKind::U))
      updates.push_back(&op);
    else
      perMb.push_back(&op);
  }
  OpBuilder b = OpBuilder::atBlockEnd(&body);
  int64_t m = d.numMicrobatches;
  std::vector<IRMapping> maps(m);
  auto cloneFor = [&](Operation *op, int64_t mb) {
    Operation *c = b.clone(*op, maps[mb]);
    auto task = dyn_cast<TaskOp>(c);
    auto batch = dyn_cast<BatchOp>(c);
    TagAttr tag = task ? task.getTag() : batch.getTag();
    c->setAttr("tag", tag.withMicrobatch(mb));
  };
  // Default order (GPipe): every forward, then every backward.
  for (int64_t mb = 0; mb < m; ++mb)
    for (Operation *op : perMb) {
      auto t = dyn_cast<TaskOp>(op);
      if (!t || !t.getTag().isPass(PassKind::B))
        cloneFor(op, mb);
    }
  for (int64_t mb = 0; mb < m; ++mb)
    for (Operation *op : perMb) {
      auto t = dyn_cast<TaskOp>(op);
      if (t && t.getTag().isPass(PassKind::B))
        cloneFor(op, mb);
    }
  for (Operation *op : updates) {
    auto u = cast<TaskOp>(op);
    SmallVector<Value> deps;
    for (Value dep : u.getDeps())
      for (int64_t mb = 0; mb < m; ++mb)
        deps.push_back(maps[mb].lookupOrDefault(dep));
    Operation *c = b.clone(*op);
    cast<TaskOp>(c).getDepsMutable().assign(deps);
  }
  for (Operation *op : llvm::reverse(updates))
    op->erase();
  for (Operation *op : llvm::reverse(perMb))
    op->erase();
  program.setNumMicrobatches(m);
  return success();
}

//===----------------------------------------------------------------------===//
// place
//===----------------------------------------------------------------------===//

static LogicalResult checkDevices(Operation *anchor, const Directive &d,
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

static LogicalResult applyPlace(ProgramOp program, const Directive &d,
                                std::optional<int64_t> worldSize) {
  if (failed(checkDevices(program, d, worldSize)))
    return failure();
  SmallVector<TaskOp> tasks = matchingTasks(program, d.filter);
  if (tasks.empty())
    return program.emitOpError(d.describe()) << ": the filter matches no task";
  Builder b(program.getContext());
  for (TaskOp t : tasks) {
    if (auto prev = t.getDevices(); prev && *prev != ArrayRef(d.devices))
      return t.emitOpError(d.describe())
             << ": overlapping placements: " << describeNode(t)
             << " is already placed on " << formatDevices(*prev);
    t.setDevicesAttr(b.getDenseI64ArrayAttr(d.devices));
    if (!t.getStream())
      t.setStreamAttr(b.getStringAttr("compute"));
    t.setSendStreamAttr(b.getStringAttr(d.stream));
  }
  return success();
}

LogicalResult mlir::piper::finalizePlacement(ModuleOp module,
                                             std::optional<int64_t> worldSize) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  Block &body = program->getBody().front();
  Builder attrs(module.getContext());
  SmallVector<TaskOp> tasks(body.getOps<TaskOp>());
  if (llvm::none_of(tasks, [](TaskOp t) { return t.getDevices(); }))
    for (TaskOp t : tasks) {
      t.setDevicesAttr(attrs.getDenseI64ArrayAttr({0}));
      t.setStreamAttr(attrs.getStringAttr("compute"));
    }
  std::set<int64_t> used;
  for (TaskOp t : tasks) {
    if (!t.getDevices())
      return t.emitOpError() << describeNode(t)
                             << " is not placed by any place directive";
    used.insert(t.getDevices()->begin(), t.getDevices()->end());
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
               << describeNode(t) << " on " << formatDevices(*t.getDevices())
               << " and " << describeNode(it->second) << " on "
               << formatDevices(*it->second.getDevices())
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
      ArrayRef<int64_t> from = *producer.getDevices(), to = *t.getDevices();
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
        StringAttr stream = producer.getSendStreamAttr();
        auto tr = TransferOp::create(
            b, producer.getLoc(), use.get(), ValueRange(), from, to,
            stream ? stream.getValue() : StringRef("pp_stream"));
        moved = tr.getResult();
      }
      use.set(moved);
    }
  }
  return sortTopologically(body);
}

/// For every parameter whose gradient is accumulated on more than one device
/// group (a tied head: the embedding's stage and the head's stage), those
/// groups, in program order.
static llvm::MapVector<StringAttr, SmallVector<ArrayRef<int64_t>>>
sharedParams(SegmentParams &segmentParams, ProgramOp program) {
  llvm::MapVector<StringAttr, SmallVector<ArrayRef<int64_t>>> groups;
  // Every microbatch runs the same segments on the same groups: visit each
  // (segment, group) once. Groups are uniqued attributes, compared by
  // pointer.
  DenseSet<std::pair<Attribute, Attribute>> seen;
  DenseMap<StringAttr, SmallVector<Attribute>> groupAttrs;
  for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
    if (!t.getTag().isPass(PassKind::B) || !t.getDevices())
      continue;
    if (!seen.insert({t.getSegmentAttr(), t.getDevicesAttr()}).second)
      continue;
    for (StringAttr p : segmentParams.accumulated(t.getSegment())) {
      SmallVector<Attribute> &attrs = groupAttrs[p];
      if (llvm::is_contained(attrs, t.getDevicesAttr()))
        continue;
      attrs.push_back(t.getDevicesAttr());
      groups[p].push_back(*t.getDevices());
    }
  }
  llvm::MapVector<StringAttr, SmallVector<ArrayRef<int64_t>>> shared;
  for (auto &[p, list] : groups)
    if (list.size() > 1)
      shared[p] = list;
  return shared;
}

//===----------------------------------------------------------------------===//
// replicate
//===----------------------------------------------------------------------===//

static LogicalResult applyReplicate(ModuleOp module, ProgramOp program,
                                    const Directive &d,
                                    std::optional<int64_t> worldSize) {
  if (failed(checkDevices(program, d, worldSize)))
    return failure();
  SmallVector<TaskOp> tasks = matchingTasks(program, d.filter);
  if (tasks.empty())
    return program.emitOpError(d.describe()) << ": the filter matches no task";
  for (TaskOp t : tasks)
    if (!t.getDevices() || *t.getDevices() != ArrayRef(d.devices))
      return t.emitOpError(d.describe())
             << ": " << describeNode(t) << " runs on "
             << (t.getDevices() ? formatDevices(*t.getDevices())
                                : std::string("no device"))
             << ", not on " << formatDevices(d.devices)
             << "; place it on the replicated devices first";
  int64_t replicas = d.devices.size();
  if (program.getReplicated() &&
      program.getNumReplicasAttr().getInt() != replicas)
    return program.emitOpError(d.describe())
           << ": data-parallel degree " << replicas
           << " differs from the degree " << program.getNumReplicas()
           << " of an earlier replicate";
  Builder attrs(module.getContext());
  program.setReplicated(true);
  program.setNumReplicas(replicas);

  SegmentParams segmentParams(module);
  SymbolTable &symbols = segmentParams.getSymbols();
  SmallVector<TaskOp> backward;
  llvm::SetVector<StringAttr> params;
  TagAttr stageTag;
  for (TaskOp t : tasks) {
    if (t.getTag().isPass(PassKind::B)) {
      backward.push_back(t);
      // Backward order: the last layers' gradients are ready first.
      params.insert_range(segmentParams.accumulated(t.getSegment()));
      if (auto pp = t.getTag().getPp())
        stageTag = TagAttr::get(attrs.getContext(), *pp, std::nullopt,
                                std::nullopt, std::nullopt, std::nullopt);
    }
  }
  // Parameters shared with another stage are summed over both stages'
  // groups at once by tieSharedParams, which subsumes this reduction.
  auto shared = sharedParams(segmentParams, program);
  params.remove_if([&](StringAttr p) { return shared.count(p) > 0; });
  if (replicas == 1 || params.empty())
    return success();
  if (!stageTag)
    stageTag = TagAttr::get(attrs.getContext());

  // Buckets of about bucketSizeMb, in gradient-ready order.
  SmallVector<SmallVector<Attribute>> buckets(1);
  double bytes = 0, limit = d.bucketSizeMb * 1024 * 1024;
  for (StringAttr p : params) {
    auto param = symbols.lookup<ParamOp>(p);
    double size = 4.0 * param.getTensorType().getNumElements();
    if (!buckets.back().empty() && bytes + size > limit) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(FlatSymbolRefAttr::get(p));
    bytes += size;
  }
  SmallVector<Value> deps;
  for (TaskOp t : backward)
    deps.push_back(t.getDone());
  OpBuilder b(module.getContext());
  b.setInsertionPointAfter(backward.back());
  SmallVector<Value> reduced;
  for (auto &bucket : buckets) {
    auto ar = AllReduceOp::create(b, backward.back().getLoc(),
                                  b.getArrayAttr(bucket), deps, d.devices,
                                  d.reduceStream, stageTag,
                                  /*collective=*/IntegerAttr());
    reduced.push_back(ar.getDone());
  }
  // Every update of a reduced parameter waits for the reduction, whether or
  // not the directive's filter matched it.
  for (TaskOp u : program.getBody().front().getOps<TaskOp>()) {
    if (!u.getTag().isPass(PassKind::U))
      continue;
    if (llvm::any_of(segmentParams.updated(u.getSegment()),
                     [&](StringAttr p) { return params.contains(p); }))
      u.getDepsMutable().append(reduced);
  }
  return sortTopologically(program.getBody().front());
}

//===----------------------------------------------------------------------===//
// order
//===----------------------------------------------------------------------===//

namespace {
/// The tasks of a program indexed by the tag values a filter names. An order
/// directive has a filter per (microbatch, pass) of its stage; scanning every
/// task for each of them made a schedule quadratic in the microbatches.
class TaskIndex {
public:
  explicit TaskIndex(ProgramOp program)
      : tasks(program.getBody().front().getOps<TaskOp>()) {}

  /// The tasks `filter` matches, in program order.
  ArrayRef<TaskOp> lookup(const Filter &filter) {
    // Tasks are bucketed by the filter's keys (and which of them are "*"),
    // then found by the values it asks for.
    std::string shape, values;
    for (const auto &[key, value] : filter.entries) {
      shape += key + (value.kind == FilterValue::Any ? "*," : "=,");
      values += valueKey(key, value) + ",";
    }
    auto [it, inserted] = byShape.try_emplace(shape);
    if (inserted)
      for (TaskOp t : tasks)
        if (std::optional<std::string> k = taskKey(t.getTag(), filter))
          it->second[*k].push_back(t);
    auto found = it->second.find(values);
    if (found == it->second.end())
      return {};
    return found->second;
  }

private:
  static std::string valueKey(StringRef key, const FilterValue &value) {
    switch (value.kind) {
    case FilterValue::Any:
      return "*";
    case FilterValue::Index:
      return std::to_string(value.index);
    case FilterValue::Pass:
      return value.pass;
    }
    return "";
  }
  /// The values of `tag` at the filter's keys, or none when it does not
  /// have them all.
  static std::optional<std::string> taskKey(TagAttr tag,
                                            const Filter &filter) {
    std::string out;
    for (const auto &[key, value] : filter.entries) {
      if (value.kind == FilterValue::Any) {
        bool present = key == "PASS" ? tag.getPass().has_value()
                                     : tag.getIndex(key).has_value();
        if (!present)
          return std::nullopt;
        out += "*,";
      } else if (key == "PASS") {
        std::optional<PassKind> pass = tag.getPass();
        if (!pass)
          return std::nullopt;
        out += stringifyPassKind(*pass).str() + ",";
      } else {
        std::optional<int64_t> index = tag.getIndex(key);
        if (!index)
          return std::nullopt;
        out += std::to_string(*index) + ",";
      }
    }
    return out;
  }

  SmallVector<TaskOp> tasks;
  llvm::StringMap<llvm::StringMap<SmallVector<TaskOp>>> byShape;
};
} // namespace

static LogicalResult applyOrder(ProgramOp program, const Directive &d) {
  SmallVector<SmallVector<TaskOp>> groups;
  std::optional<ArrayRef<int64_t>> devices;
  TaskOp first;
  TaskIndex index(program);
  for (auto [gi, group] : llvm::enumerate(d.groups)) {
    llvm::SetVector<Operation *> tasks;
    for (const Filter &f : group)
      for (TaskOp t : index.lookup(f))
        tasks.insert(t);
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
          devices = *t.getDevices();
          first = t;
        } else if (*devices != *t.getDevices()) {
          return t.emitOpError(d.describe())
                 << ": an order directive must cover one device group, but "
                 << describeNode(first) << " runs on "
                 << formatDevices(*devices) << " and " << describeNode(t)
                 << " on " << formatDevices(*t.getDevices());
        }
      }
      ts.push_back(t);
    }
    groups.push_back(std::move(ts));
  }
  for (size_t g = 0; g + 1 < groups.size(); ++g)
    for (TaskOp next : groups[g + 1]) {
      llvm::SetVector<Value> deps(next.getDeps().begin(), next.getDeps().end());
      for (TaskOp prev : groups[g])
        if (prev != next)
          deps.insert(prev.getDone());
      next.getDepsMutable().assign(deps.getArrayRef());
    }
  SmallVector<Operation *> cycle;
  if (failed(sortTopologically(program.getBody().front(), &cycle))) {
    std::string path;
    for (Operation *op : cycle)
      path += describeNode(op) + " -> ";
    if (!cycle.empty())
      path += describeNode(cycle.front());
    return program.emitOpError(d.describe())
           << ": the order contradicts the dataflow and creates a cycle: "
           << path;
  }
  return success();
}

LogicalResult mlir::piper::tieSharedParams(ModuleOp module) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  SegmentParams segmentParams(module);
  auto shared = sharedParams(segmentParams, *program);
  if (shared.empty())
    return success();
  Block &body = program->getBody().front();
  OpBuilder b(module.getContext());
  int64_t collective = 0;
  for (auto &[param, groups] : shared) {
    // Every rank holding a copy takes part: the sum over all of them is the
    // full gradient (each copy saw one use, each replica one slice of data).
    std::set<int64_t> members;
    for (ArrayRef<int64_t> g : groups)
      members.insert(g.begin(), g.end());
    size_t total = 0;
    for (ArrayRef<int64_t> g : groups)
      total += g.size();
    if (members.size() != total)
      return program->emitOpError("parameter @")
             << param.getValue()
             << " is shared by device groups that overlap; its gradient "
                "cannot be summed once per copy";
    SmallVector<Value> deps;
    TaskOp last;
    for (TaskOp t : body.getOps<TaskOp>()) {
      if (!t.getTag().isPass(PassKind::B))
        continue;
      if (llvm::is_contained(segmentParams.accumulated(t.getSegment()),
                             param)) {
        deps.push_back(t.getDone());
        last = t;
      }
    }
    b.setInsertionPointAfter(last);
    SmallVector<int64_t> devices(members.begin(), members.end());
    auto ar = AllReduceOp::create(
        b, last.getLoc(), b.getArrayAttr({FlatSymbolRefAttr::get(param)}),
        deps, devices, "dp_stream", TagAttr::get(b.getContext()),
        b.getI64IntegerAttr(collective++));
    for (TaskOp u : body.getOps<TaskOp>()) {
      if (!u.getTag().isPass(PassKind::U))
        continue;
      if (llvm::is_contained(segmentParams.updated(u.getSegment()), param))
        u.getDepsMutable().append(ValueRange{ar.getDone()});
    }
  }
  return sortTopologically(body);
}

LogicalResult mlir::piper::applyDirective(ModuleOp module, const Directive &d,
                                          std::optional<int64_t> worldSize) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  switch (d.kind) {
  case Directive::Stage:
    return applyStage(module, d.stages);
  case Directive::Split:
    return applySplit(*program, d);
  case Directive::Place:
    return applyPlace(*program, d, worldSize);
  case Directive::Replicate:
    return applyReplicate(module, *program, d, worldSize);
  case Directive::Order:
    return applyOrder(*program, d);
  case Directive::Schedule: {
    const ScheduleBuilder *schedule = findSchedule(d.schedule);
    if (!schedule)
      return program->emitOpError(d.describe())
             << ": unknown schedule '" << d.schedule << "' (expected "
             << scheduleNames() << ")";
    return applySchedule(module, *schedule, d.describe());
  }
  }
  return failure();
}

LogicalResult mlir::piper::applySchedule(ModuleOp module,
                                         const ScheduleBuilder &schedule,
                                         StringRef what) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  int64_t stages = 0;
  for (TaskOp t : program->getBody().front().getOps<TaskOp>()) {
    if (auto pp = t.getTag().getPp())
      stages = std::max(stages, *pp + 1);
    if (!t.getTag().isPass(PassKind::U) && !t.getTag().getMb())
      return t.emitOpError(what)
             << ": " << describeNode(t)
             << " has no MB tag: schedules order microbatches, run "
                "piper-split first";
  }
  int64_t microbatches = program->getNumMicrobatches();
  if (std::string err = schedule.check(stages, microbatches); !err.empty())
    return program->emitOpError(what)
           << ": schedule '" << schedule.name << "' " << err;
  for (Directive &d : buildSchedule(schedule, stages, microbatches))
    if (failed(applyDirective(module, d, std::nullopt)))
      return failure();
  return success();
}

/// The directives of `strategy` of one kind, in order.
static SmallVector<const Directive *> directivesOfKind(const Strategy &strategy,
                                                       Directive::Kind kind) {
  SmallVector<const Directive *> out;
  for (const Directive &d : strategy.directives)
    if (d.kind == kind)
      out.push_back(&d);
  return out;
}

/// A strategy has at most one stage directive.
static LogicalResult checkOneStage(ModuleOp module, const Strategy &strategy) {
  if (auto st = directivesOfKind(strategy, Directive::Stage); st.size() > 1)
    return module.emitError(st[1]->describe())
           << ": only one stage directive is allowed";
  return success();
}

LogicalResult mlir::piper::applyStrategy(ModuleOp module,
                                         const Strategy &strategy,
                                         const OptimizerConfig &opt) {
  if (failed(checkOneStage(module, strategy)))
    return failure();
  int64_t stages = numStages(strategy);
  if (failed(applyStage(module, stages)) ||
      failed(buildTrainingDag(module, opt)))
    return failure();
  return applyDirectives(module, strategy);
}

LogicalResult mlir::piper::applyDirectives(ModuleOp module,
                                           const Strategy &strategy) {
  auto ofKind = [&](Directive::Kind kind) {
    return directivesOfKind(strategy, kind);
  };
  if (failed(checkOneStage(module, strategy)))
    return failure();
  SmallVector<const Directive *> splits = ofKind(Directive::Split);
  if (splits.size() > 1)
    return module.emitError(splits[1]->describe())
           << ": only one split directive is allowed";
  Directive one;
  one.kind = Directive::Split;
  one.numMicrobatches = 1;
  one.text = "implicit split num_microbatches=1";
  if (failed(applyDirective(module, splits.empty() ? one : *splits.front(),
                            strategy.worldSize)))
    return failure();
  for (Directive::Kind kind : {Directive::Place, Directive::Replicate,
                               Directive::Order, Directive::Schedule}) {
    for (const Directive *d : ofKind(kind))
      if (failed(applyDirective(module, *d, strategy.worldSize)))
        return failure();
    if (kind == Directive::Place &&
        failed(finalizePlacement(module, strategy.worldSize)))
      return failure();
    if (kind == Directive::Replicate && failed(tieSharedParams(module)))
      return failure();
  }
  return success();
}
