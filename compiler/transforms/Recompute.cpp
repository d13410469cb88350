// The `recompute` directive (docs/recompute.md): marks the forward ops of
// the model blocks it selects with their recompute region (`piper.recompute`,
// the block index). Autodiff then keeps only the regions' inputs for the
// backward and re-runs the marked ops there (BuildTrainingDag.cpp).
#include "compiler/transforms/Transforms.h"

#include "mlir/Interfaces/SideEffectInterfaces.h"

using namespace mlir;
using namespace mlir::piper;

/// The ops of `seg` the granularity recomputes.
static SmallVector<Operation *> regionOps(SegmentOp seg, bool selective) {
  SmallVector<Operation *> ops;
  for (Operation &op : seg.getBody().front().without_terminator()) {
    if (selective ? !isa<AttentionOp, CpAttentionOp>(op)
                  : isa<ParamRefOp>(op) || !isPure(&op))
      continue;
    ops.push_back(&op);
  }
  return ops;
}

/// Whether `seg` holds an attention core (ring attention under context
/// parallelism).
static bool hasAttention(SegmentOp seg) {
  Block &body = seg.getBody().front();
  return !body.getOps<AttentionOp>().empty() ||
         !body.getOps<CpAttentionOp>().empty();
}

LogicalResult mlir::piper::applyRecompute(ModuleOp module, ProgramOp program,
                                          const Directive &d) {
  auto fail = [&](Operation *at) {
    return at->emitOpError(d.describe()) << ": ";
  };
  bool selective =
      d.get<RecomputeOptions>().granularity == RecomputeGranularity::Selective;
  std::optional<int64_t> wanted;
  if (auto it = d.filter.entries.find("block");
      it != d.filter.entries.end() && it->second.kind == FilterValue::Index)
    wanted = it->second.index;

  SymbolTable symbols(module);
  SmallVector<TaskOp> tasks(program.getBody().front().getOps<TaskOp>());
  // The block tasks the filter selects, with their segments.
  SmallVector<std::pair<TaskOp, SegmentOp>> matched;
  int64_t lastBlock = -1;
  for (TaskOp t : tasks) {
    TagAttr tag = t.getTag();
    if (!tag.getBlock() || tag.getPp() || tag.getPass().has_value())
      return fail(t) << "recompute rewrites the forward model before stage "
                        "and autodiff, but "
                     << describeNode(t)
                     << " is already staged (expected tasks tagged with "
                        "'block' only)";
    lastBlock = std::max(lastBlock, *tag.getBlock());
    auto seg = symbols.lookup<SegmentOp>(t.getSegment());
    if (!seg)
      return fail(t) << describeNode(t) << " calls unknown segment @"
                     << t.getSegment();
    bool take = wanted ? *tag.getBlock() == *wanted : hasAttention(seg);
    if (take)
      matched.push_back({t, seg});
  }
  if (matched.empty()) {
    if (wanted)
      return fail(program) << "the model has no block " << *wanted
                           << " (its blocks are 0 to " << lastBlock << ")";
    return fail(program) << "the model has no transformer block (a block "
                            "with attention) to recompute";
  }
  for (auto [t, seg] : matched) {
    int64_t block = *t.getTag().getBlock();
    // A segment several blocks call is marked for all of them.
    for (TaskOp other : tasks)
      if (other.getSegment() == t.getSegment() &&
          !llvm::any_of(matched, [&](auto &m) { return m.first == other; }))
        return fail(t) << "block " << block << "'s segment @" << t.getSegment()
                       << " is also called by block "
                       << *other.getTag().getBlock()
                       << ", which the directive does not select";
    if (selective && !hasAttention(seg))
      return fail(t) << "selective recomputation re-runs the attention core, "
                        "but block "
                     << block << " has no attention";
    SmallVector<Operation *> ops = regionOps(seg, selective);
    if (ops.empty())
      return fail(t) << "block " << block << " has no forward op to recompute";
    for (Operation *op : ops) {
      if (std::optional<int64_t> region = getRecomputeRegion(op);
          region && *region != block)
        return fail(t) << "block " << block << "'s ops are already in the "
                       << "recompute region of block " << *region;
      setRecomputeRegion(op, block);
    }
  }
  return success();
}
