// `piperc search`: the compiler picks the strategy. It enumerates the
// strategies of every axis Piper has for a model and a device count, prunes
// them by rules and bounds that cost nothing, compiles the most promising in
// process, keeps those whose exact memory plan fits the device, and ranks
// them by the simulator's step time on a machine description. The method,
// its bounds and its limits are in docs/search.md.
#ifndef PIPER_COMPILER_SEARCH_SEARCH_H
#define PIPER_COMPILER_SEARCH_SEARCH_H

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "compiler/strategy/Strategy.h"
#include "compiler/transforms/Transforms.h"
#include "mlir/IR/BuiltinOps.h"
#include "proto/analysis/Simulate.h"

namespace mlir::piper::search {

/// What the search needs to know of a model, read from its ops (a model
/// file carries no configuration): sizes for the rules and the bounds.
struct ModelFacts {
  /// Sequences per microbatch and tokens per sequence (the token input).
  int64_t batch = 0, seq = 0;
  int64_t hidden = 0, vocab = 0;
  /// Transformer blocks (attention ops), their heads and key/value heads.
  int64_t layers = 0, heads = 0, kvHeads = 0;
  /// Experts per MoE layer (0: dense) and the expert slots each MoE layer
  /// dispatches per microbatch (its all-to-all's rows).
  int64_t experts = 0, dispatchRows = 0;
  /// Parameter elements: those of expert weights, and the others.
  int64_t denseParams = 0, expertParams = 0;
  /// FLOPs of one microbatch's forward pass over the whole model, and of
  /// its attention cores (what selective recomputation repeats).
  double forwardFlops = 0, attentionFlops = 0;
};

/// Reads the facts of a verified model module; an error when it is not a
/// model the search can reason about (no token input, no attention).
FailureOr<ModelFacts> scanModel(ModuleOp module, std::string &error);

/// What to search and on what.
struct SearchOptions {
  int64_t devices = 0;
  /// Memory of one device in bytes: the exact plan must fit it.
  int64_t deviceMemory = 0;
  /// Sequences per optimizer step over all replicas (a multiple of the
  /// model's microbatch size times the data-parallel degree).
  int64_t globalBatch = 0;
  ::piper::plan::Machine machine;
  OptimizerConfig opt;
  /// Gradient bucket sizes (MB) tried for data-parallel strategies.
  std::vector<double> bucketsMb = {kDefaultBucketMb};
  /// Strategies compiled at most (in the order of the estimate), and a
  /// wall-clock limit in seconds (0: none) after which none more starts.
  int64_t maxCompiles = 32;
  /// Strategies to know exactly (the table's rows).
  int64_t top = 3;
  double timeLimit = 0;
  int jobs = 1;
};

/// One strategy of the space, before compiling.
struct Candidate {
  StrategyFlags flags;
  /// Enumeration index: ties of the estimate keep this order.
  int64_t index = 0;
  /// A lower bound on any rank's parameter state (parameters, gradients,
  /// AdamW moments; ZeRO's shards), bytes: no plan of this strategy needs
  /// less (docs/search.md derives it).
  int64_t stateLowerBound = 0;
  /// A rough step time and peak memory, only to order what is compiled
  /// first (the ranking is the simulator's).
  double estimateSeconds = 0;
  int64_t estimatePeakBytes = 0;
};

/// One candidate after compiling.
struct Evaluated {
  Candidate candidate;
  enum class Outcome { Refused, TooBig, Unsimulated, Fits };
  Outcome outcome = Outcome::Refused;
  /// Why it was refused, did not fit or could not be simulated.
  std::string why;
  /// The simulated step, its worst class's compute bubble, and over every
  /// rank the largest arena (its exact memory plan).
  double stepSeconds = 0, bubble = 0;
  int64_t peakBytes = 0, stateBytes = 0;
  /// The busy time of the simulation's busiest stream (any class).
  double busiestStream = 0;
  /// Non-zero: this result comes from compiling the candidate with this
  /// many microbatches (its proxy) and extrapolating (docs/search.md §1).
  int64_t proxyMicrobatches = 0;
  std::string strategyJson;
};

/// What became of the space.
struct SearchCounts {
  int64_t enumerated = 0, prunedByRule = 0, prunedByMemory = 0;
  /// Compiles (proxies and whole), and of those the whole compiles that
  /// confirmed a proxied candidate.
  int64_t compiled = 0, confirmed = 0, refused = 0, tooBig = 0, fitting = 0;
  /// Per rule, how many candidates it pruned ("tp must divide the heads").
  std::map<std::string, int64_t> rules;
};

struct SearchResult {
  /// The model as the search read it.
  ModelFacts facts;
  /// The fitting strategies, fastest first (ties: enumeration order).
  std::vector<Evaluated> ranked;
  /// Every compiled candidate in compile order (the tests check each).
  std::vector<Evaluated> compiled;
  SearchCounts counts;
  bool timedOut = false;
};

/// The legal strategies of `facts` on `options.devices`, each with its
/// bounds, in the order they would be compiled (most promising first); the
/// rules' prunings counted into `counts`.
std::vector<Candidate> enumerateCandidates(const ModelFacts &facts,
                                           const SearchOptions &options,
                                           SearchCounts &counts);

/// The search's lower bound on any rank's parameter state for `flags`.
int64_t stateLowerBound(const ModelFacts &facts, const StrategyFlags &flags);

/// The microbatches of the proxy that stands for `flags` in the first
/// phase (the smallest count from pp, at least 2, its schedule accepts), or
/// 0 when the candidate is compiled whole (at most 4 such).
int64_t proxyMicrobatches(const StrategyFlags &flags);

/// Turns the result of a proxy (`e.proxyMicrobatches` microbatches) into
/// the estimate for its candidate's count: the step plus the busiest
/// stream's time per microbatch for each further one; the peak kept (a
/// 1F1B-like schedule holds at most its warm-up in flight), grown in
/// proportion for GPipe; too big when that exceeds the device.
void extrapolate(Evaluated &e, const SearchOptions &options);

/// Progress as it goes: called (from one thread at a time) after each
/// compiled candidate.
using Progress = std::function<void(const SearchCounts &, int64_t toCompile,
                                    double elapsedSeconds)>;

/// The whole search over the model text `modelText` (parsed once per
/// worker): enumerate, prune, compile up to the budget on `options.jobs`
/// threads, fit, simulate, rank. Deterministic for a given budget: the
/// result does not depend on the number of jobs (a time limit that cuts
/// the search short is reported in `timedOut`).
FailureOr<SearchResult> runSearch(llvm::StringRef modelText,
                                  const SearchOptions &options,
                                  const Progress &progress, std::string &error);

/// The layout of `flags` as one cell: "pp2 dp2 tp2 sp cp2(ring) ep2".
std::string layoutName(const StrategyFlags &flags);

/// The ranked strategies as a table (one row each, at most `top`):
/// layout, schedule, microbatches, ZeRO, recompute, predicted step time,
/// tokens/s, MFU against the machine's peak, bubble, peak memory per rank
/// and headroom.
std::string formatTable(const SearchResult &result,
                        const SearchOptions &options, int64_t top);

} // namespace mlir::piper::search

#endif // PIPER_COMPILER_SEARCH_SEARCH_H
