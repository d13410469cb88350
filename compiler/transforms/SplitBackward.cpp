// Split backward: the BI/BW decomposition of zero-bubble schedules. A
// backward task becomes an input-gradient task (BI: the chain of activation
// gradients, which the previous stage waits for) and a weight-gradient task
// (BW: the weight gradients and their accumulations), which a schedule may
// run later. BW reads the
// residuals and the intermediate gradients it needs, which stay alive until
// it runs.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERSPLITBACKWARD
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

/// Assigns each top-level op of a backward segment to BI (0) or BW (1): the
/// weight gradients (ops with the WeightGradient trait), the gradient
/// accumulations, and every op that reads their results (sums of a
/// parameter's gradient contributions) are BW; everything else (the chain
/// of activation gradients, also inside a first stage that returns none)
/// is BI. BI never reads a BW value: input gradients do not depend on
/// weight gradients.
DenseMap<Operation *, unsigned>
mlir::piper::weightGradientOps(SegmentOp seg, ArrayRef<bool> weightArgs) {
  Block &body = seg.getBody().front();
  DenseMap<Operation *, unsigned> pieceOf;
  // Producers come before their users in the block, so one forward sweep
  // sees every BW operand first.
  for (Operation &op : body.without_terminator()) {
    bool weight = op.hasTrait<OpTrait::piper::WeightGradient>() ||
                  isa<AccumulateGradOp>(op);
    op.walk([&](Operation *nested) {
      for (Value v : nested->getOperands()) {
        if (Operation *def = v.getDefiningOp();
            def && def->getBlock() == &body && pieceOf.lookup(def) == 1)
          weight = true;
        if (auto arg = dyn_cast<BlockArgument>(v);
            arg && arg.getOwner() == &body &&
            arg.getArgNumber() < weightArgs.size() &&
            weightArgs[arg.getArgNumber()])
          weight = true;
      }
    });
    pieceOf[&op] = weight ? 1 : 0;
  }
  return pieceOf;
}

/// A symbol name not yet taken in `symbols`, starting from `name`.
static std::string freshName(SymbolTable &symbols, std::string name) {
  std::string candidate = name;
  for (int i = 1; symbols.lookup(candidate); ++i)
    candidate = name + "." + std::to_string(i);
  return candidate;
}

/// Splits a backward segment into its input-gradient half (BI: <base>_BI)
/// and its weight-gradient half (BW: <base>_BW), registered in `symbols`.
static FailureOr<SegmentPieces> splitBackwardSegment(SegmentOp seg,
                                                     SymbolTable &symbols) {
  StringRef name = seg.getSymName();
  std::string base =
      name.ends_with("_B") ? name.drop_back(2).str() : name.str();
  SmallVector<std::string> names = {freshName(symbols, base + "_BI"),
                                    freshName(symbols, base + "_BW")};
  FailureOr<SegmentPieces> pieces =
      splitSegmentByOps(seg, weightGradientOps(seg), names,
                        /*passThroughPiece=*/0);
  if (failed(pieces))
    return failure();
  const PassKind passes[] = {PassKind::BI, PassKind::BW};
  for (auto [i, piece] : llvm::enumerate(pieces->pieces)) {
    setSegmentPass(piece, passes[i]);
    symbols.insert(piece);
  }
  return pieces;
}

/// Whether `v` is a weight gradient computed by another node: a BW task's
/// result, or a collective's over one (the gathered key/value pieces'
/// reduce-scatter, docs/tensor-parallel.md §2b).
static bool isWeightGradientValue(Value v) {
  Operation *def = v.getDefiningOp();
  if (auto t = dyn_cast_or_null<TaskOp>(def))
    return t.getTag().isPass(PassKind::BW);
  if (def && isa<CollectiveOpInterface>(def))
    return llvm::any_of(def->getOperands(), isWeightGradientValue);
  return false;
}

LogicalResult mlir::piper::splitBackwardTasks(ProgramOp program,
                                              ArrayRef<TaskOp> tasks) {
  auto module = program->getParentOfType<ModuleOp>();
  SymbolTable symbols(module);
  llvm::MapVector<StringAttr, SegmentPieces> piecesOf;
  // Segments made only of weight-gradient work (the piece after a
  // collective on a weight gradient's path, e.g. the gathered key/value
  // pieces' reduce-scatter under tensor parallelism): BW whole, with no BI
  // half that would wait for that collective.
  llvm::DenseSet<StringAttr> allWeight;
  for (TaskOp t : tasks) {
    StringAttr name = t.getSegmentAttr().getAttr();
    if (allWeight.contains(name)) {
      t->setAttr("tag", t.getTag().withPass(PassKind::BW));
      continue;
    }
    if (!piecesOf.count(name)) {
      auto seg = symbols.lookup<SegmentOp>(name);
      if (!seg)
        return t.emitOpError("calls unknown segment @") << name.getValue();
      SmallVector<bool> weightArgs;
      for (Value arg : t.getArgs())
        weightArgs.push_back(isWeightGradientValue(arg));
      DenseMap<Operation *, unsigned> weight =
          weightGradientOps(seg, weightArgs);
      Block &body = seg.getBody().front();
      if (llvm::is_contained(weightArgs, true) &&
          !body.without_terminator().empty() &&
          llvm::all_of(body.without_terminator(), [&](Operation &op) {
            return weight.lookup(&op) == 1;
          })) {
        setSegmentPass(seg, PassKind::BW);
        allWeight.insert(name);
        t->setAttr("tag", t.getTag().withPass(PassKind::BW));
        continue;
      }
      FailureOr<SegmentPieces> pieces = splitBackwardSegment(seg, symbols);
      if (failed(pieces))
        return failure();
      piecesOf[name] = std::move(*pieces);
    }
    // Another backward node of the same stage and microbatch that waits for
    // this one (the next piece of a chain, or the all-to-all between expert
    // pieces) only needs its input gradients: it waits for BI. Everything
    // else (updates, reductions) waits for BW.
    TagAttr tag = t.getTag();
    auto inChain = [&](Operation *user) {
      TagAttr other;
      if (auto task = dyn_cast<TaskOp>(user))
        other = task.getTag();
      else if (auto c = dyn_cast<CollectiveOpInterface>(user))
        other = c.getTag();
      else if (auto r = dyn_cast<RingShiftOp>(user))
        other = r.getTag();
      return other && other.isBackward() && other.getPp() == tag.getPp() &&
             other.getMb() == tag.getMb();
    };
    SmallVector<OpOperand *> chained;
    for (OpOperand &use : t.getDone().getUses())
      if (inChain(use.getOwner()))
        chained.push_back(&use);
    SmallVector<TaskOp> halves = splitTask(t, piecesOf[name]);
    halves[0]->setAttr("tag", tag.withPass(PassKind::BI));
    halves[1]->setAttr("tag", tag.withPass(PassKind::BW));
    for (OpOperand *use : chained)
      use->set(halves[0].getDone());
  }
  // A fused segment no task calls any more is dropped.
  eraseUncalledSegments(program, symbols, piecesOf);
  return success();
}

namespace {
struct SplitBackwardPass
    : mlir::piper::impl::PiperSplitBackwardBase<SplitBackwardPass> {
  using PiperSplitBackwardBase::PiperSplitBackwardBase;
  void runOnOperation() override {
    FailureOr<ProgramOp> program = getProgram(getOperation());
    if (failed(program))
      return signalPassFailure();
    auto wanted = [](ArrayRef<int64_t> list, std::optional<int64_t> index) {
      return list.empty() || (index && llvm::is_contained(list, *index));
    };
    SmallVector<TaskOp> tasks;
    for (TaskOp t : program->getBody().front().getOps<TaskOp>())
      if (t.getTag().isPass(PassKind::B) && wanted(pp, t.getTag().getPp()) &&
          wanted(mb, t.getTag().getMb()))
        tasks.push_back(t);
    if (failed(splitBackwardTasks(*program, tasks)))
      signalPassFailure();
  }
};
} // namespace
