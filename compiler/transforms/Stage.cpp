// The `stage` directive: groups contiguous model blocks into pipeline stages.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERSTAGE
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

/// Splits costs into `parts` contiguous groups minimizing the largest group;
/// returns the index of the first element of each group.
static SmallVector<size_t> balancedPartition(ArrayRef<double> costs,
                                             size_t parts) {
  size_t n = costs.size();
  std::vector<double> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[p][i]: minimal max cost splitting the first i items into p groups.
  std::vector<std::vector<double>> best(parts + 1,
                                        std::vector<double>(n + 1, inf));
  std::vector<std::vector<size_t>> cut(parts + 1, std::vector<size_t>(n + 1));
  best[0][0] = 0;
  for (size_t p = 1; p <= parts; ++p)
    for (size_t i = p; i <= n; ++i)
      for (size_t j = p - 1; j < i; ++j) {
        double c = std::max(best[p - 1][j], prefix[i] - prefix[j]);
        if (c < best[p][i]) {
          best[p][i] = c;
          cut[p][i] = j;
        }
      }
  SmallVector<size_t> starts(parts);
  size_t i = n;
  for (size_t p = parts; p >= 1; --p) {
    starts[p - 1] = cut[p][i];
    i = cut[p][i];
  }
  return starts;
}

LogicalResult mlir::piper::applyStage(ModuleOp module, int64_t stages) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  SmallVector<TaskOp> tasks(program->getBody().front().getOps<TaskOp>());
  if (tasks.empty())
    return program->emitOpError("has no tasks to stage");
  for (TaskOp t : tasks)
    if (!t.getTag().getBlock() || t.getTag().getPp() ||
        t.getTag().getPass().has_value())
      return t.emitOpError("stage expects forward model tasks tagged with "
                           "'block' only, got ")
             << t.getTag();
  if (stages < 1 || size_t(stages) > tasks.size())
    return program->emitOpError("cannot make ")
           << stages << " pipeline stages from " << tasks.size()
           << " model blocks";

  SymbolTable symbols(module);
  SmallVector<double> costs;
  for (TaskOp t : tasks) {
    auto seg = symbols.lookup<SegmentOp>(t.getSegment());
    if (!seg)
      return t.emitOpError("calls unknown segment @") << t.getSegment();
    costs.push_back(estimateSegmentCost(seg).flops);
  }
  SmallVector<size_t> starts = balancedPartition(costs, stages);

  OpBuilder b(module.getContext());
  llvm::SetVector<SegmentOp> oldSegments;
  for (int64_t s = 0; s < stages; ++s) {
    size_t begin = starts[s];
    size_t end = s + 1 < stages ? starts[s + 1] : tasks.size();
    MutableArrayRef<TaskOp> group(tasks.data() + begin, end - begin);
    llvm::DenseSet<Operation *> inGroup;
    for (TaskOp t : group)
      inGroup.insert(t);
    // Inputs: operands defined outside the group; outputs: results used
    // outside it, or not used at all (the loss).
    llvm::SetVector<Value> inputs, outputs, deps;
    for (TaskOp t : group)
      for (Value d : t.getDeps())
        if (!inGroup.contains(d.getDefiningOp()))
          deps.insert(d);
    for (TaskOp t : group) {
      for (Value v : t.getArgs())
        if (!inGroup.contains(v.getDefiningOp()))
          inputs.insert(v);
      for (Value r : t.getOuts()) {
        bool external = r.use_empty();
        for (Operation *user : r.getUsers())
          external |= !inGroup.contains(user);
        if (external)
          outputs.insert(r);
      }
    }
    SmallVector<Type> inTypes, outTypes;
    for (Value v : inputs)
      inTypes.push_back(v.getType());
    for (Value v : outputs)
      outTypes.push_back(v.getType());

    b.setInsertionPoint(*program);
    std::string name = "stage" + std::to_string(s);
    auto seg = SegmentOp::create(b, group.front().getLoc(), name,
                                 b.getFunctionType(inTypes, outTypes));
    Block &body = seg.getBody().front();
    IRMapping map;
    for (auto [v, arg] : llvm::zip(inputs, body.getArguments()))
      map.map(v, arg);
    OpBuilder sb = OpBuilder::atBlockEnd(&body);
    for (TaskOp t : group) {
      auto callee = symbols.lookup<SegmentOp>(t.getSegment());
      oldSegments.insert(callee);
      Block &cb = callee.getBody().front();
      IRMapping inner;
      for (auto [arg, v] : llvm::zip(cb.getArguments(), t.getArgs()))
        inner.map(arg, map.lookup(v));
      for (Operation &op : cb.without_terminator())
        sb.clone(op, inner);
      auto yield = cast<YieldOp>(cb.getTerminator());
      for (auto [r, y] : llvm::zip(t.getOuts(), yield.getValues()))
        map.map(r, inner.lookup(y));
    }
    SmallVector<Value> yielded;
    for (Value v : outputs)
      yielded.push_back(map.lookup(v));
    YieldOp::create(sb, group.back().getLoc(), yielded);
    symbols.insert(seg);

    b.setInsertionPoint(group.back());
    auto tag = TagAttr::get(b.getContext(), s, std::nullopt, std::nullopt,
                            std::nullopt, std::nullopt);
    auto task = TaskOp::create(
        b, group.back().getLoc(), TypeRange(outTypes), b.getType<TokenType>(),
        FlatSymbolRefAttr::get(seg.getSymNameAttr()), inputs.getArrayRef(),
        deps.getArrayRef(), tag, DeviceGroupAttr(), StreamAttr(), StreamAttr());
    for (auto [i, old] : llvm::enumerate(outputs))
      Value(old).replaceAllUsesWith(task.getOuts()[i]);
    for (TaskOp t : llvm::reverse(group)) {
      t.getDone().replaceAllUsesWith(task.getDone());
      t.erase();
    }
  }
  for (SegmentOp seg : oldSegments)
    if (SymbolTable::symbolKnownUseEmpty(seg, module))
      seg.erase();
  return success();
}

namespace {
struct StagePass : mlir::piper::impl::PiperStageBase<StagePass> {
  using PiperStageBase::PiperStageBase;
  void runOnOperation() override {
    if (failed(applyStage(getOperation(), stages)))
      signalPassFailure();
  }
};
} // namespace
