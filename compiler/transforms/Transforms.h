// Entry points of the program rewrites behind the piper passes: staging,
// autodiff, the strategy directives, per-device splitting and stream order.
#ifndef PIPER_COMPILER_TRANSFORMS_TRANSFORMS_H
#define PIPER_COMPILER_TRANSFORMS_TRANSFORMS_H

#include <optional>

#include "compiler/analysis/ProgramInfo.h"
#include "compiler/strategy/Strategy.h"
#include "dialects/piper/PiperDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::piper {

/// AdamW hyper-parameters recorded in the update segments.
struct OptimizerConfig {
  double lr = 6e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weightDecay = 0.1;
  /// Learning-rate schedule: warmup, cosine decay to minLr (see plan.proto).
  double minLr = 6e-5;
  int64_t warmupSteps = 0;
  int64_t decaySteps = 0;
  /// Global-norm clipping threshold; 0 disables it.
  double clipGradNorm = 1.0;
  /// Builds forward and backward only: no update tasks, so gradients
  /// accumulate across steps (gradient checks, debugging).
  bool noUpdate = false;
  /// The fused classifier: a returned cross_entropy computes its logits'
  /// gradient in the forward (piper.cross_entropy_fused), bit for bit
  /// cross_entropy_grad's; false keeps the gradient in the backward.
  bool fuseClassifier = true;
  /// Gradients one GEMM epilogue computes together are one op: a biased
  /// linear's weight and bias gradients (piper.linear_grad_weight_bias),
  /// bit for bit the separate ops' on the CPU; false keeps them apart.
  bool fuseEpilogues = true;
  /// The lowering to plans pads a classifier's logits (and their gradient)
  /// to rows of a multiple of this many columns; 0 or 1: no padding
  /// (compiler/lowering/VocabPadding.h).
  int64_t padVocab = 64;
  /// Mixed precision: f32 or bf16 (see plan.proto compute_dtype).
  ComputeType dtype = ComputeType::f32;
};

/// The parameters each segment reads, accumulates and updates, computed once
/// per segment: a program runs each segment for many microbatches, and
/// walking a segment per task made directives quadratic.
class SegmentParams {
public:
  explicit SegmentParams(ModuleOp module) : symbols(module) {}
  /// Every parameter the segment refers to, without repeats, in op order.
  ArrayRef<StringAttr> used(StringRef segment) { return get(segment).used; }
  /// The parameters of its piper.accumulate_grad ops, in op order.
  ArrayRef<StringAttr> accumulated(StringRef segment) {
    return get(segment).accumulated;
  }
  /// The parameters of its piper.adamw ops, in op order.
  ArrayRef<StringAttr> updated(StringRef segment) {
    return get(segment).updated;
  }
  SymbolTable &getSymbols() { return symbols; }

private:
  struct Entry {
    SmallVector<StringAttr> used, accumulated, updated;
  };
  const Entry &get(StringRef segment);
  SymbolTable symbols;
  llvm::StringMap<Entry> cache;
};

/// Where an input of a segment piece, or a result of the split segment,
/// comes from: argument `index` of the task (piece -1), or output `index` of
/// piece `piece`.
struct PieceSource {
  int piece;
  unsigned index;
};
/// A segment cut into consecutive pieces (SegmentPieces.cpp).
struct SegmentPieces {
  SmallVector<SegmentOp> pieces;
  SmallVector<SmallVector<PieceSource>> inputs; // per piece
  SmallVector<PieceSource> results;             // the segment's results
  /// Per piece: the values of the split segment it outputs, in order
  /// (valid while the split segment exists).
  SmallVector<SmallVector<Value>> outputValues;
};

/// Splits `seg` before each op index of `cuts` (increasing, inside its op
/// list) into new segments named <seg>.0, <seg>.1, ... after it: a value
/// defined in one piece and read in a later one becomes an output and an
/// input; parameter reads are repeated in each piece that reads them.
/// `seg` itself is left for the caller to erase once no task calls it.
FailureOr<SegmentPieces> splitSegment(SegmentOp seg, ArrayRef<unsigned> cuts);

/// splitSegment cutting before and after every op `isMarker` selects (a
/// collective's stand-in, which becomes a piece of its own), and before
/// every op `cutBefore` selects, with the pieces inserted into `symbols`.
FailureOr<SegmentPieces>
splitAround(SegmentOp seg, llvm::function_ref<bool(Operation &)> isMarker,
            SymbolTable &symbols,
            llvm::function_ref<bool(Operation &)> cutBefore = nullptr);

/// Splits `seg` into `names.size()` pieces by an assignment of its
/// top-level ops: `pieceOf[op]` must be at least the piece of every op whose
/// result it reads (pieces run in order). Results that are arguments passed
/// through leave from piece `passThroughPiece`. The pieces are new segments
/// named `names` after `seg`, with its attributes.
FailureOr<SegmentPieces>
splitSegmentByOps(SegmentOp seg, const DenseMap<Operation *, unsigned> &pieceOf,
                  ArrayRef<std::string> names, unsigned passThroughPiece);

/// A task calling `piece` with `args` after `deps`, with the tag, devices,
/// streams and discardable attributes of `t` (the task it replaces part of).
TaskOp createPieceTask(OpBuilder &b, TaskOp t, SegmentOp piece, ValueRange args,
                       ValueRange deps);

/// Replaces `t` (a task calling the split segment) by a chain of tasks, one
/// per piece, with its tag, devices and streams; the first keeps its
/// dependencies, each next waits for the one before, and users of its
/// results and token read the pieces'. Returns the new tasks in order.
SmallVector<TaskOp> splitTask(TaskOp t, const SegmentPieces &pieces);

/// Erases from `symbols` the split segments (the keys of `piecesOf`) that no
/// task of `program` calls any more: one walk for all of them (a walk per
/// segment made splitting quadratic in the program under many microbatches).
void eraseUncalledSegments(
    ProgramOp program, SymbolTable &symbols,
    const llvm::MapVector<StringAttr, SegmentPieces> &piecesOf);

/// A node of a split task's chain: a piece's task, or what a piece became
/// instead (a collective), with the values standing for the piece's
/// outputs, in order, and its token.
struct PieceNode {
  Operation *op = nullptr;
  SmallVector<Value> outs;
  Value done;
  /// Whether the next piece waits for this node's token. An unchained
  /// node (a ring exchange) is ordered by its data alone: the pieces after
  /// it wait for the node before it, so the exchange runs beside them and
  /// only the piece that reads its result waits for it.
  bool chained = true;
};
/// What `splitTaskWith` makes of piece `piece` given its arguments and its
/// dependencies (built with the builder, before the task), or nullopt for a
/// task calling the piece.
using PieceBuilder = llvm::function_ref<std::optional<PieceNode>(
    OpBuilder &, unsigned piece, ArrayRef<Value> args, ArrayRef<Value> deps)>;
/// splitTask, where `special` may turn pieces into other nodes (the
/// all-to-alls of expert parallelism, the all-reduces of tensor
/// parallelism). Returns the chain's nodes in order.
SmallVector<PieceNode> splitTaskWith(TaskOp t, const SegmentPieces &pieces,
                                     PieceBuilder special);

/// Moves each accumulate_grad of `seg` up to just after the op that
/// computes its gradient (the block's start for an argument), but never
/// before an earlier accumulation of the same parameter (so each
/// accumulator adds in the same order). Before cutting a backward
/// segment around markers: a column layer's weight gradient is
/// computed before its input gradient's all-reduce, but autodiff
/// accumulates it after; cut there, one piece would hand the next a weight
/// gradient, and once a split backward divides the pieces into BI and BW
/// (zero-bubble schedules), or ZeRO hands each piece's gradients to a
/// reduce-scatter, the next piece's BI would read this piece's BW.
void hoistAccumulations(SegmentOp seg);

/// The body of `piece` when it is exactly one op of type OpT (a marker a
/// rewrite cut out of its segment), or null.
template <typename OpT> OpT soleOp(SegmentOp piece) {
  auto body = piece.getBody().front().without_terminator();
  return llvm::hasSingleElement(body) ? dyn_cast<OpT>(*body.begin()) : OpT();
}

/// Whether `op` is a segment collective (SegmentCollectiveOpInterface)
/// over `axis`: where that axis's lowering cuts a segment.
bool isSegmentCollective(Operation &op, Axis axis);
/// The segment collective `piece` holds alone (a piece of a segment cut
/// around them), or null.
SegmentCollectiveOpInterface soleSegmentCollective(SegmentOp piece);
/// Where a segment collective of a task runs (piper-lower-segment-
/// collectives): over the task's devices, each rank with its member of
/// `subgroups` (its axis's groups; null: the devices are one group), on
/// `stream`. A ring exchange with `overlap` runs beside the ring steps.
struct CollectiveBinding {
  ArrayAttr subgroups;
  StreamAttr stream;
  bool overlap = true;
};
/// splitTask for a task whose segment was cut around segment collectives
/// (`pieces`): each piece holding one becomes the program node of its kind
/// over the task's devices, bound by `bindingOf` (of the collective), with
/// the tag of `t`. An overlapped ring shift is ordered by its data alone
/// (unchained), as the ring's exchanges run beside its steps.
SmallVector<PieceNode> splitTaskAtCollectives(
    TaskOp t, const SegmentPieces &pieces,
    llvm::function_ref<CollectiveBinding(SegmentCollectiveOpInterface)>
        bindingOf);

/// Replaces each backward task of `tasks` (SplitBackward.cpp) by an
/// input-gradient task (BI: the activation-gradient chain) and, after it, a
/// weight-gradient task (BW: ops with the WeightGradient trait, the
/// accumulations and what reads them): its results come from BI, and
/// whatever waited for it waits for BW (another backward piece of the same
/// stage and microbatch, for BI).
LogicalResult splitBackwardTasks(ProgramOp program, ArrayRef<TaskOp> tasks);
/// The half of splitBackwardTasks each top-level op of a backward segment
/// goes to: 0 (BI) or 1 (BW: ops with the WeightGradient trait, gradient
/// accumulations and every op that reads one of their results, or an
/// argument flagged in `weightArgs`, a weight gradient computed elsewhere).
DenseMap<Operation *, unsigned>
weightGradientOps(SegmentOp seg, ArrayRef<bool> weightArgs = {});

/// Splits `params` (in order) into buckets of about `bucketSizeMb` of f32,
/// each naming a parameter at most once.
SmallVector<SmallVector<Attribute>> bucketParams(SymbolTable &symbols,
                                                 ArrayRef<StringAttr> params,
                                                 double bucketSizeMb);

/// `replicate` with ZeRO stage d.zero (Zero.cpp): shards the state of
/// `params` over d.devices, with the reduce-scatters and all-gathers that
/// implies, for the stage whose backward tasks are `backward`. Under tensor
/// parallelism `subgroups` are the data replicas of each member: each
/// member shards its own tensors over them.
LogicalResult applyZero(ModuleOp module, ProgramOp program, const Directive &d,
                        const llvm::SetVector<StringAttr> &params,
                        ArrayRef<TaskOp> backward, TagAttr stageTag,
                        ArrayAttr subgroups);

/// After the order directives: bounds the ZeRO-2/3 gradients in flight and
/// sets the ZeRO-3 gathers' prefetch distance (Zero.cpp).
LogicalResult boundZeroCollectives(ModuleOp module);

/// The `shard` directive (ExpertParallel.cpp): expert parallelism for the
/// MoE layers of the tasks placed on d.devices.
LogicalResult applyShard(ModuleOp module, ProgramOp program,
                         const Directive &d);

/// The `recompute` directive (Recompute.cpp), on the forward model before
/// stage: marks the forward ops of the blocks it selects (all of them, or
/// the attention core) with their recompute region, which autodiff re-runs
/// in the backward instead of keeping their results.
LogicalResult applyRecompute(ModuleOp module, ProgramOp program,
                             const Directive &d);

/// The `shard_tensor` directive (TensorParallel.cpp), on the forward model
/// before stage: splits the matrices of the blocks it selects over
/// tensor-parallel groups (local parameter slices, local attention heads),
/// with Megatron's f and g as `piper.tp_copy` and `piper.tp_reduce`, and
/// records the degree on the module.
LogicalResult applyShardTensor(ModuleOp module, ProgramOp program,
                               const Directive &d);

/// The `context_parallel` directive (ContextParallel.cpp), on the forward
/// model before stage: every microbatch's sequence split over groups of
/// `cp` devices (Megatron's load-balanced chunks), every value with a row
/// per token holding the member's rows, attention as ring attention
/// (`piper.cp_attention`); records the degree on the module.
LogicalResult applyContextParallel(ModuleOp module, ProgramOp program,
                                   const Directive &d);

/// After placement (piper-lower-context-parallel): every
/// `piper.cp_attention` and `piper.cp_attention_grad` becomes its ring of
/// `piper.attention_block(_grad)` kernels with the exchanges between them
/// (`piper.cp_ring_shift`), Ulysses' and the MoE gathers their segment
/// collectives. Nothing without `context_parallel`.
LogicalResult lowerContextParallel(ModuleOp module);

/// After placement and the axis rewrites (piper-lower-segment-collectives,
/// SegmentCollectives.cpp): every segment a task calls is cut around its
/// segment collectives (tp, cp and ep alike), each becoming a program node
/// of its kind over its axis's groups of the task's devices on its axis's
/// stream; tensor parallelism's `piper.tp_copy`s go.
LogicalResult lowerSegmentCollectives(ModuleOp module);

/// Returns the single piper.program of `module`, or emits an error.
FailureOr<ProgramOp> getProgram(ModuleOp module);

/// Groups the model's block tasks into `stages` contiguous pipeline stages,
/// balanced by estimated FLOPs, merging each group into one segment.
LogicalResult applyStage(ModuleOp module, int64_t stages);

/// Reverse-mode autodiff: forward, backward and update tasks per stage.
LogicalResult buildTrainingDag(ModuleOp module, const OptimizerConfig &opt);

// One directive each (Split.cpp, Place.cpp, Replicate.cpp, Order.cpp):
// `worldSize`, when known, bounds the device indices.
LogicalResult applySplit(ProgramOp program, const Directive &d);
LogicalResult applyPlace(ProgramOp program, const Directive &d,
                         std::optional<int64_t> worldSize);
LogicalResult applyReplicate(ModuleOp module, ProgramOp program,
                             const Directive &d,
                             std::optional<int64_t> worldSize);
LogicalResult applyOrder(ProgramOp program, const Directive &d);
/// Order directives `ds` (verified) one after the other, with one sort of
/// the program after all of them; a cycle is reported for the first
/// directive that closes one, as applying them one at a time would.
LogicalResult applyOrders(ProgramOp program, ArrayRef<const Directive *> ds);

/// Applies one directive to the program, after the one verifier of
/// directives (verifyDirective) has checked it: every directive pass and
/// the directive pipeline come here. `worldSize`, when known, bounds the
/// device indices.
LogicalResult applyDirective(ModuleOp module, const Directive &directive,
                             std::optional<int64_t> worldSize);

/// Orders every stage's tasks by `schedule` (the order directives its
/// builder emits); `what` names the directive or pass in diagnostics.
LogicalResult applySchedule(ModuleOp module, const ScheduleBuilder &schedule,
                            StringRef what);

/// Checks that every task is placed and inserts piper.transfer on each data
/// edge that crosses device groups. Unplaced tasks go to device 0 when no
/// task is placed at all.
LogicalResult finalizePlacement(ModuleOp module,
                                std::optional<int64_t> worldSize);

/// Sums the gradient of every parameter used by several stages (a tied LM
/// head) over all device groups holding a copy: one piper.all_reduce over
/// their union after the last backward using it, before every update of it.
/// Placement must be final. The all-reduces take buckets of `bucketMb` MB
/// (the replicate directives' bucket_size, the smallest when they differ).
LogicalResult tieSharedParams(ModuleOp module,
                              double bucketMb = kDefaultBucketMb);

/// Splits the program into one piper.device_program per device class.
LogicalResult splitDevices(ModuleOp module);

/// Fixes the issue order of every device program (receives just before
/// their consumers, sends right after their producers). That the programs
/// then finish a step together is proven on their plans (lowerToPlans).
LogicalResult orderStreams(ModuleOp module);

/// Whether `tag` matches `filter`.
bool matchesFilter(TagAttr tag, const Filter &filter);

/// Topologically re-sorts the ops of `block` (data and token edges): of the
/// ops whose producers have all been placed, the one that comes first today
/// goes next (Kahn's algorithm by position). Fails when the edges contain a
/// cycle, and then returns the ops on it in `cycle`.
///
/// Not MLIR's `mlir::sortTopologically` (TopologicalSortUtils.h), on
/// purpose: its stable sort sweeps forward and places an op as soon as it is
/// ready within the sweep, so after a schedule's `order` edges it
/// interleaves the device groups differently (1F1B on two stages puts stage
/// 1's F1 before stage 0's B0; by position, B0 comes first). The program's
/// block order is the schedule's global order that piper-order-streams and
/// the lit tests read, and MLIR's sort reports no cycle, which is the
/// `order` directive's main error. docs/compiler.md ("Block order").
LogicalResult sortTopologically(Block &block,
                                SmallVectorImpl<Operation *> *cycle = nullptr);

/// The stream named `name` for communication nodes of `program`: a compute
/// stream when a task of `program` already computes on it (the strategy
/// then serializes the communication with compute), else a comm stream.
StreamAttr commStream(Operation *program, StringRef name);
/// The directive a per-stage pass (piper-place, piper-replicate,
/// piper-shard) stands for: its options, with the filter `{"PP": pp}`.
Directive stageDirective(Directive::Options options, int64_t pp,
                         StringRef passName);
/// The `axis` groups of `layout` over a stage's `devices` (the layout's rank
/// i is devices[i]; devices.size() is its world), by first member; as
/// device-group attributes in deviceGroupAttrs.
SmallVector<SmallVector<int64_t>> layoutGroups(ArrayRef<int64_t> devices,
                                               const ParallelLayout &layout,
                                               Axis axis);
SmallVector<Attribute> deviceGroupAttrs(MLIRContext *ctx,
                                        ArrayRef<int64_t> devices,
                                        const ParallelLayout &layout,
                                        Axis axis);
/// `devices` (a stage's class, or several) cut into expert-parallel groups
/// of `members`: the layout's ep groups (consecutive gradient replicas of
/// one tensor member). Empty when they do not tile.
SmallVector<SmallVector<int64_t>> expertGroups(ArrayRef<int64_t> devices,
                                               int64_t members, MeshAttr mesh);
/// The tasks of `program` whose tag matches `filter`, in block order.
SmallVector<TaskOp> matchingTasks(ProgramOp program, const Filter &filter);
/// Why a `place` or `replicate` filter naming PASS "BI" or "BW" matches no
/// task (the halves exist only once an `order` splits the backward), or "".
std::string splitPassHint(const Filter &filter);
/// Fails (naming the directive `d`) when one of its `devices` is outside the
/// world.
LogicalResult checkDevices(Operation *anchor, const Directive &d,
                           ArrayRef<int64_t> devices,
                           std::optional<int64_t> worldSize);
/// For every parameter whose gradient is accumulated on more than one device
/// group (a tied head), those groups, in program order.
llvm::MapVector<StringAttr, SmallVector<ArrayRef<int64_t>>>
sharedParams(SegmentParams &segmentParams, ProgramOp program);

} // namespace mlir::piper

#endif // PIPER_COMPILER_TRANSFORMS_TRANSFORMS_H
