// Strategies: the directive list (JSON or flags) that rewrites the training
// DAG, and the schedule builders that emit `order` directives.
#ifndef PIPER_COMPILER_STRATEGY_STRATEGY_H
#define PIPER_COMPILER_STRATEGY_STRATEGY_H

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "compiler/strategy/JsonScan.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace mlir::piper {

/// Limits on what a strategy (a file or the flags) may ask for. Each is far
/// beyond any real training job; beyond them memory or compile time would
/// grow without end, so piperc rejects the strategy with an error instead.
/// docs/user-guide.md ("Limits") lists them.
inline constexpr int64_t kMaxWorldSize = 1 << 20; // devices
inline constexpr int64_t kMaxStages = 1 << 14;    // pipeline stages
/// Compile time grows faster than linearly in the microbatches (about 18 s
/// for 8,192 on one core), so this bound also bounds compile time.
inline constexpr int64_t kMaxMicrobatches = 1 << 13; // per replica per step
/// Pipeline stages times microbatches: the tasks of one pass.
inline constexpr int64_t kMaxStageMicrobatches = 1 << 17;
inline constexpr int64_t kMaxOrderGroups = 1 << 15; // groups of one order
inline constexpr int64_t kMaxFilterIndex = 1 << 20; // PP, EP or MB index

/// One entry of a filter: an exact index, any index ("*"), or a pass name.
struct FilterValue {
  enum Kind { Index, Any, Pass } kind = Any;
  int64_t index = 0;
  std::string pass;
  std::string str() const;
};

/// Selects program nodes by their tags. A node matches when every key of the
/// filter is present in its tag with a matching value; an empty filter
/// matches every node.
struct Filter {
  std::map<std::string, FilterValue> entries;
  std::string str() const;
};

/// Keys a filter may use.
inline constexpr llvm::StringLiteral kFilterKeys[] = {"PP", "EP", "MB", "PASS"};
/// Keys a recompute or shard_tensor filter may use: it selects model blocks
/// of the forward model, before stage gives them PP tags.
inline constexpr llvm::StringLiteral kRecomputeFilterKeys[] = {"block"};

/// The gradient bucket size of `replicate` (`bucket_size`, `--bucket-mb`)
/// when none is given, in MB of 2^20 bytes: PyTorch DDP's default.
inline constexpr double kDefaultBucketMb = 25;

// The options of each directive kind (docs/directives.md gives their JSON
// keys). A directive holds exactly one of them (Directive::options), so a
// pass reads only its own kind's options and a new directive is one more
// struct, not more fields in a union.

/// stage: the number of pipeline stages.
struct StageOptions {
  int64_t stages = 1;
};
/// split: the number of microbatches (along "MB", over the whole DAG).
struct SplitOptions {
  int64_t microbatches = 1;
};
/// place: the device group and the stream of the transfers it inserts.
struct PlaceOptions {
  std::vector<int64_t> devices;
  std::string stream = "pp_stream";
};
/// replicate: data parallelism over `devices`.
struct ReplicateOptions {
  std::vector<int64_t> devices;
  /// The stream of the gradient all-reduces (or reduce-scatters).
  std::string reduceStream = "dp_stream";
  /// The stream of the ZeRO parameter all-gathers.
  std::string gatherStream = "dp_stream";
  /// The gradient bucket size in MB of 2^20 bytes.
  double bucketMb = kDefaultBucketMb;
  /// The ZeRO stage (0: none; 1: AdamW moments sharded over the replicas;
  /// 2: and gradients; 3: and parameters).
  int zero = 0;
};
/// shard: expert parallelism for the MoE layers placed on `devices`.
struct ShardOptions {
  std::vector<int64_t> devices;
  /// The expert-parallel degree (experts split over groups of this many
  /// gradient replicas); 0 means all of `devices`' replicas.
  int64_t ep = 0;
  std::string stream = "ep_stream";
};
/// order: groups of filters in time order.
struct OrderOptions {
  std::vector<std::vector<Filter>> groups;
};
/// schedule: a name from the schedule registry.
struct ScheduleOptions {
  std::string name;
};
/// recompute: what of a matched block the backward recomputes.
enum class RecomputeGranularity {
  Full,      ///< every op of the block
  Selective, ///< its attention core
};
struct RecomputeOptions {
  RecomputeGranularity granularity = RecomputeGranularity::Full;
};
/// shard_tensor: tensor parallelism for the matched blocks.
struct ShardTensorOptions {
  /// The tensor-parallel degree (the members of each group that splits the
  /// blocks' matrices).
  int64_t tp = 0;
  /// Sequence parallelism: the blocks' norms, residual adds and biases run
  /// on each member's rows.
  bool sequenceParallel = false;
  /// Vocabulary parallelism: the token embedding and the LM head split by
  /// vocabulary rows, the loss computed without gathering the logits.
  bool vocabParallel = true;
  /// The stream of its all-reduces.
  std::string stream = "tp_stream";
};
/// context_parallel: how attention sees the other members' tokens.
enum class ContextParallelKind {
  Ring,    ///< ring attention: K/V blocks passed around the group
  Ulysses, ///< all-to-alls from the sequence to the heads and back
};
struct ContextParallelOptions {
  /// The context-parallel degree (the members of each group that splits
  /// every microbatch's sequence).
  int64_t cp = 0;
  ContextParallelKind kind = ContextParallelKind::Ring;
  /// Whether each ring exchange runs beside the step before it (true) or
  /// after it, on the critical path (false).
  bool overlap = true;
  /// The stream of its exchanges.
  std::string stream = "cp_stream";
};

/// "full" / "selective", "ring" / "ulysses": the names the JSON, the flags
/// and the pass options use.
llvm::StringRef stringify(RecomputeGranularity granularity);
llvm::StringRef stringify(ContextParallelKind kind);
std::optional<RecomputeGranularity>
parseRecomputeGranularity(llvm::StringRef name);
std::optional<ContextParallelKind>
parseContextParallelKind(llvm::StringRef name);

/// One directive of a strategy, as parsed from JSON or built from flags: its
/// place in the strategy, its text, its filter and its kind's options.
struct Directive {
  /// The kinds, in the order of Options' alternatives.
  enum Kind {
    Stage,
    Split,
    Place,
    Replicate,
    Shard,
    Order,
    Schedule,
    Recompute,
    ShardTensor,
    ContextParallel
  };
  using Options = std::variant<StageOptions, SplitOptions, PlaceOptions,
                               ReplicateOptions, ShardOptions, OrderOptions,
                               ScheduleOptions, RecomputeOptions,
                               ShardTensorOptions, ContextParallelOptions>;

  Directive() = default;
  Directive(Options options, std::string text = "", Filter filter = {})
      : text(std::move(text)), filter(std::move(filter)),
        options(std::move(options)) {}

  /// Position in the strategy and the directive's own text, for diagnostics.
  int index = 0;
  std::string text;
  /// The program nodes (or, for recompute and shard_tensor, the model
  /// blocks) it applies to.
  Filter filter;
  Options options;

  Kind kind() const { return static_cast<Kind>(options.index()); }
  /// The options of kind T (which must be the directive's).
  template <typename T> T &get() { return std::get<T>(options); }
  template <typename T> const T &get() const { return std::get<T>(options); }

  /// "directive #3 (place {...})" for messages.
  std::string describe() const;
  /// "split", "place", ... as the JSON `op` names it.
  llvm::StringRef kindName() const;
};

/// A whole strategy: directives plus an optional declared world size.
struct Strategy {
  std::vector<Directive> directives;
  std::optional<int64_t> worldSize;
  /// A one-line summary, e.g. "pp=2 dp=2 microbatches=4 schedule=1f1b".
  std::string summary;
};

/// The number of pipeline stages a strategy asks for: its stage directive,
/// or else one more than the largest PP index its placements name (1 when
/// none does).
int64_t numStages(const Strategy &strategy);

/// Parses a strategy file: either a JSON list of directives (the original
/// Piper format) or an object {"world_size": N, "directives": [...]}.
/// Unknown directives and keys, bad filter keys or values, and malformed
/// device lists are errors naming the directive; so are a key an object
/// repeats and lists nested more than kMaxJsonNesting deep.
llvm::Expected<Strategy> parseStrategy(llvm::StringRef json);

/// The strategy as a JSON object parseStrategy reads back to the same
/// directives: {"world_size": N, "summary": "...", "directives": [...]},
/// every option written out (piperc search's strategy files).
std::string strategyToJson(const Strategy &strategy);

/// Reads the strategy file `path` (a `what`: "strategy file", "order file";
/// "-" is standard input) with the shared input reader and parses it;
/// errors name the file.
llvm::Expected<Strategy>
readStrategyFile(const std::string &path,
                 llvm::StringRef what = "strategy file");

/// An error message when `stages` pipeline stages of `microbatches`
/// microbatches are more tasks than kMaxStageMicrobatches, or "".
std::string checkStageMicrobatches(int64_t stages, int64_t microbatches);

/// One task of a schedule: a pipeline stage's pass over a microbatch.
struct ScheduledTask {
  int64_t stage = 0;
  int64_t mb = 0;
  std::string pass; // "F", "B", "BI" or "BW"
};
/// Tasks with no order among them: one task, or an overlap slot of several
/// (which the compiler runs on different streams).
using ScheduleSlot = std::vector<ScheduledTask>;
/// The order of one pipeline device group: slots in time order.
using DeviceOrder = std::vector<ScheduleSlot>;

/// How a schedule's P*v stages sit on its P pipeline device groups.
enum class StageLayout {
  Linear,      ///< one stage per device group: stage d on group d
  Interleaved, ///< v stages per group: group d holds d, d+P, d+2P, ...
  V,           ///< two per group: group d holds stages d and 2P-1-d
  /// Two copies of a P-stage model: the first half of the microbatches runs
  /// stage s on group s, the second half on group P-1-s (DualPipe); the
  /// copies' gradients are summed.
  Bidirectional,
};

/// The device group (of `devices`) that runs `stage` in `layout`; for the
/// bidirectional layout, that of the first half of the microbatches.
int64_t deviceOfStage(StageLayout layout, int64_t stage, int64_t devices);
/// The device group that runs microbatch `mb` (of `microbatches`) of
/// `stage` in `layout`.
int64_t deviceOfTask(StageLayout layout, int64_t stage, int64_t mb,
                     int64_t devices, int64_t microbatches);

/// A pipeline schedule: its name, the constraints it checks and the order it
/// gives each pipeline device group. `--schedule NAME`, the JSON `schedule`
/// directive and the piper-schedule pass all find schedules in one registry
/// (getScheduleBuilders, Schedules.cpp); a new schedule is one more entry.
struct ScheduleBuilder {
  llvm::StringRef name;
  llvm::StringRef summary;
  StageLayout layout;
  /// What it needs, for `--schedule help` ("microbatches >= 2P").
  llvm::StringRef needs;
  /// An error message when the schedule cannot order `perDevice` stages on
  /// each of `devices` device groups over `microbatches` microbatches, or
  /// "" when it can.
  std::string (*check)(int64_t devices, int64_t perDevice,
                       int64_t microbatches);
  /// The order of device group `device`.
  DeviceOrder (*build)(int64_t device, int64_t devices, int64_t perDevice,
                       int64_t microbatches);
};

/// Every registered schedule, in listing order.
llvm::ArrayRef<ScheduleBuilder> getScheduleBuilders();
/// The schedule called `name`, or null.
const ScheduleBuilder *findSchedule(llvm::StringRef name);
/// The registered names, "gpipe, 1f1b, ...", for diagnostics.
std::string scheduleNames();
/// One line per schedule (name, layout, needs, summary), for `--schedule
/// help`.
std::string formatScheduleTable();
/// Stages per device group when the strategy does not say: 2 for the V and
/// interleaved layouts, 1 otherwise.
int64_t defaultStagesPerDevice(const ScheduleBuilder &schedule);

/// Emits one `order` directive per pipeline device group for `schedule`.
std::vector<Directive> buildSchedule(const ScheduleBuilder &schedule,
                                     int64_t devices, int64_t perDevice,
                                     int64_t microbatches);

/// Builds the strategy for `--pp P --dp D --microbatches M --schedule S
/// --zero Z --ep E --virtual-stages V --bucket-mb B --tp T`: P*V stages (V:
/// 0 for the schedule's default), stage s on the devices [g*D*T,
/// (g+1)*D*T) of its pipeline group g in the schedule's layout (rank
/// g*D*T + d*T + t: tensor parallelism innermost, as Megatron orders it;
/// with --cp C, D*C*T devices per group, rank g*D*C*T + (d*C + c)*T + t),
/// replicated with ZeRO stage Z in gradient buckets of B MB, its experts
/// split over groups of E of them, every block's matrices over groups of T.
Strategy strategyFromFlags(int64_t pp, int64_t dp, int64_t microbatches,
                           const ScheduleBuilder &schedule, int zero = 0,
                           int64_t ep = 1, int64_t virtualStages = 0,
                           double bucketMb = kDefaultBucketMb, int64_t tp = 1,
                           int64_t cp = 1);

/// piperc's strategy flags.
struct StrategyFlags {
  int64_t pp = 1, dp = 1, microbatches = 1;
  std::string schedule = "1f1b";
  int zero = 0;
  int64_t ep = 1;
  int64_t virtualStages = 0;          // 0: the schedule's default
  double bucketMb = kDefaultBucketMb; // replicate's bucket_size
  /// --recompute: "none", "full" or "selective".
  std::string recompute = "none";
  /// --tp: the tensor-parallel degree.
  int64_t tp = 1;
  /// --sp: sequence parallelism (needs --tp).
  bool sp = false;
  /// --no-vocab-parallel: keep the embedding and LM head whole on every
  /// tensor-parallel member (needs --tp).
  bool noVocabParallel = false;
  /// --cp: the context-parallel degree; --cp-kind: "ring" or "ulysses"
  /// ("": not given, ring).
  int64_t cp = 1;
  std::string cpKind;
  /// --cp-no-overlap: the ring's exchanges after the step before them.
  bool cpNoOverlap = false;
};

/// The strategy of the flags: errors name the flags (`--ep 3 must divide
/// --dp 2: ...`); the built strategy then passes verifyStrategy, as a file's
/// does.
llvm::Expected<Strategy> buildStrategy(const StrategyFlags &flags);

/// The one verifier of directives, however written (a strategy file, the
/// flags, a directive pass's options): each option's range (stages,
/// microbatches, degrees, the ZeRO stage, the bucket size), device lists
/// (in the world, none twice), streams named, an order's split-backward
/// stencil, a known schedule. Errors name the directive.
llvm::Error verifyDirective(const Directive &d);
/// verifyDirective for each directive, and the limit on stages times
/// microbatches over the strategy.
llvm::Error verifyStrategy(const Strategy &strategy);

/// Whether groups of `groupSize` tile `devices` devices (an expert-parallel
/// degree of a data-parallel group).
bool dividesDevices(int64_t groupSize, int64_t devices);

} // namespace mlir::piper

#endif // PIPER_COMPILER_STRATEGY_STRATEGY_H
