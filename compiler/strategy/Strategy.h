// Strategies: the directive list (JSON or flags) that rewrites the training
// DAG, and the schedule builders that emit `order` directives.
#ifndef PIPER_COMPILER_STRATEGY_STRATEGY_H
#define PIPER_COMPILER_STRATEGY_STRATEGY_H

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace mlir::piper {

/// Limits on what a strategy (a file or the flags) may ask for. Each is far
/// beyond any real training job; beyond them memory or compile time would
/// grow without end, so piperc rejects the strategy with an error instead.
/// docs/user-guide.md ("Limits") lists them.
inline constexpr int64_t kMaxWorldSize = 1 << 20;      // devices
inline constexpr int64_t kMaxStages = 1 << 14;         // pipeline stages
/// Compile time grows faster than linearly in the microbatches (about 18 s
/// for 8,192 on one core), so this bound also bounds compile time.
inline constexpr int64_t kMaxMicrobatches = 1 << 13;   // per replica per step
/// Pipeline stages times microbatches: the tasks of one pass.
inline constexpr int64_t kMaxStageMicrobatches = 1 << 17;
inline constexpr int64_t kMaxOrderGroups = 1 << 15;    // groups of one order
inline constexpr int64_t kMaxFilterIndex = 1 << 20;    // PP, EP or MB index
inline constexpr int64_t kMaxJsonNesting = 64;         // lists and objects

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

/// One directive of a strategy, as parsed from JSON or built from flags.
struct Directive {
  enum Kind { Stage, Split, Place, Replicate, Order, Schedule } kind = Split;
  /// Position in the strategy and the directive's own text, for diagnostics.
  int index = 0;
  std::string text;

  Filter filter;
  std::vector<int64_t> devices;
  std::string stream;        // place: stream of the send/recv it inserts
  std::string reduceStream;  // replicate: stream of the all-reduces
  double bucketSizeMb = 25;  // replicate: gradient bucket size
  /// replicate: the ZeRO stage (0: none; 1: AdamW moments sharded over the
  /// replicas; 2: and gradients; 3: and parameters) and the stream of its
  /// parameter all-gathers.
  int zero = 0;
  std::string gatherStream;
  int64_t numMicrobatches = 1;
  std::string dimName = "MB";
  int64_t stages = 1;
  std::vector<std::vector<Filter>> groups; // order: groups in time order
  std::string schedule; // schedule: a name from the schedule registry

  /// "directive #3 (place {...})" for messages.
  std::string describe() const;
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
/// device lists are errors naming the directive.
llvm::Expected<Strategy> parseStrategy(llvm::StringRef json);

/// An error message when `stages` pipeline stages of `microbatches`
/// microbatches are more tasks than kMaxStageMicrobatches, or "".
std::string checkStageMicrobatches(int64_t stages, int64_t microbatches);

/// The (microbatch, pass) pairs one pipeline stage runs, in time order.
using StageOrder = std::vector<std::pair<int64_t, std::string>>;

/// A pipeline schedule: its name, the constraints it checks and the order it
/// gives each stage. `--schedule NAME`, the JSON `schedule` directive and the
/// piper-schedule pass all find schedules in one registry
/// (getScheduleBuilders); a new schedule is one more entry there.
struct ScheduleBuilder {
  llvm::StringRef name;
  llvm::StringRef summary;
  /// An error message when the schedule cannot order `stages` stages of
  /// `microbatches` microbatches, or "" when it can.
  std::string (*check)(int64_t stages, int64_t microbatches);
  /// The order of stage `stage` (of `stages`).
  StageOrder (*build)(int64_t stage, int64_t stages, int64_t microbatches);
};

/// Every registered schedule, in listing order.
llvm::ArrayRef<ScheduleBuilder> getScheduleBuilders();
/// The schedule called `name`, or null.
const ScheduleBuilder *findSchedule(llvm::StringRef name);
/// The registered names, "gpipe, 1f1b", for diagnostics.
std::string scheduleNames();
/// One line per schedule (name and summary), for `--schedule help`.
std::string formatScheduleTable();

/// Emits one `order` directive per pipeline stage for `schedule`.
std::vector<Directive> buildSchedule(const ScheduleBuilder &schedule,
                                     int64_t stages, int64_t microbatches);

/// Builds the strategy for `--pp P --dp D --microbatches M --schedule S
/// --zero Z`: stage s runs on devices [s*D, (s+1)*D), replicated with ZeRO
/// stage Z.
Strategy strategyFromFlags(int64_t pp, int64_t dp, int64_t microbatches,
                           const ScheduleBuilder &schedule, int zero = 0);

} // namespace mlir::piper

#endif // PIPER_COMPILER_STRATEGY_STRATEGY_H
