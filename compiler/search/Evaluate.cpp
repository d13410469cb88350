// The search's expensive half: compile the candidates in process on worker
// threads (one MLIR context each), check each exact memory plan against the
// device, simulate the fitting ones on the machine, rank them; and the table.
#include "compiler/search/Search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "compiler/lowering/LowerToPlan.h"
#include "compiler/transforms/Passes.h"
#include "dialects/piper/PiperDialect.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "proto/analysis/MemoryPlan.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace mlir::piper;
using namespace mlir::piper::search;

namespace {
/// One worker's context, the parsed model and the first error the compiler
/// reported for the candidate at hand.
class Worker {
public:
  Worker(llvm::StringRef modelText, const SearchOptions &options)
      : ctx(MLIRContext::Threading::DISABLED), options(options),
        handler(&ctx, [this](Diagnostic &d) {
          if (d.getSeverity() == DiagnosticSeverity::Error &&
              firstError.empty())
            firstError = d.str();
          return success();
        }) {
    ctx.loadDialect<PiperDialect>();
    ctx.printOpOnDiagnostic(false);
    model = parseSourceString<ModuleOp>(modelText, ParserConfig(&ctx));
  }

  bool ready() const { return static_cast<bool>(model); }

  Evaluated evaluate(const Candidate &c) {
    Evaluated e;
    e.candidate = c;
    firstError.clear();
    llvm::Expected<Strategy> strategy = buildStrategy(c.flags);
    if (!strategy) {
      e.why = llvm::toString(strategy.takeError());
      return e;
    }
    OwningOpRef<ModuleOp> module = model->clone();
    PassManager pm(&ctx);
    addCompilePipeline(pm, *strategy, options.opt, CompilePhase::Plan);
    FailureOr<LoweredPlans> lowered = failure();
    if (succeeded(pm.run(*module)))
      lowered = lowerToPlans(*module, "search", strategy->summary);
    if (failed(lowered)) {
      e.why = firstError.empty() ? "the compiler refused it" : firstError;
      return e;
    }
    for (const ::piper::plan::Plan &plan : lowered->plans) {
      e.peakBytes = std::max<int64_t>(e.peakBytes, plan.arena_bytes());
      e.stateBytes = std::max<int64_t>(e.stateBytes, plan.state_bytes());
      bool fits = false;
      std::string verdict =
          ::piper::plan::fitVerdict(plan, options.deviceMemory, fits);
      if (!fits && e.outcome != Evaluated::Outcome::TooBig) {
        e.outcome = Evaluated::Outcome::TooBig;
        e.why = verdict;
      }
    }
    if (e.outcome == Evaluated::Outcome::TooBig)
      return e;
    ::piper::plan::Simulation sim;
    std::string error;
    if (!::piper::plan::simulate(lowered->plans, options.machine, {}, sim,
                                 error)) {
      e.outcome = Evaluated::Outcome::Unsimulated;
      e.why = error;
      return e;
    }
    e.stepSeconds = sim.stepTime;
    for (const ::piper::plan::ClassTime &c : sim.classes)
      e.bubble = std::max(e.bubble, c.bubbleFraction);
    e.strategyJson = strategyToJson(*strategy);
    e.outcome = Evaluated::Outcome::Fits;
    return e;
  }

private:
  MLIRContext ctx;
  const SearchOptions &options;
  ScopedDiagnosticHandler handler;
  OwningOpRef<ModuleOp> model;
  std::string firstError;
};

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}
} // namespace

FailureOr<SearchResult> search::runSearch(llvm::StringRef modelText,
                                          const SearchOptions &options,
                                          const Progress &progress,
                                          std::string &error) {
  auto start = std::chrono::steady_clock::now();
  FailureOr<ModelFacts> facts = failure();
  {
    MLIRContext ctx(MLIRContext::Threading::DISABLED);
    ctx.loadDialect<PiperDialect>();
    ctx.printOpOnDiagnostic(false);
    std::string parseError;
    ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &d) {
      if (parseError.empty())
        parseError = d.str();
      return success();
    });
    OwningOpRef<ModuleOp> module =
        parseSourceString<ModuleOp>(modelText, ParserConfig(&ctx));
    if (!module) {
      error = "the model does not parse: " + parseError;
      return failure();
    }
    facts = scanModel(*module, error);
  }
  if (failed(facts))
    return failure();
  SearchResult result;
  result.facts = *facts;
  std::vector<Candidate> candidates =
      enumerateCandidates(*facts, options, result.counts);
  const int64_t toCompile =
      std::min<int64_t>(options.maxCompiles, candidates.size());
  std::vector<std::optional<Evaluated>> done(toCompile);
  std::atomic<int64_t> next{0};
  std::atomic<bool> timedOut{false};
  std::mutex mutex;
  auto work = [&] {
    Worker worker(modelText, options);
    if (!worker.ready())
      return;
    while (true) {
      int64_t i = next++;
      if (i >= toCompile)
        return;
      if (options.timeLimit > 0 && secondsSince(start) > options.timeLimit) {
        timedOut = true;
        return;
      }
      Evaluated e = worker.evaluate(candidates[i]);
      std::lock_guard<std::mutex> lock(mutex);
      SearchCounts &n = result.counts;
      ++n.compiled;
      switch (e.outcome) {
      case Evaluated::Outcome::Refused:
        ++n.refused;
        break;
      case Evaluated::Outcome::TooBig:
        ++n.tooBig;
        break;
      case Evaluated::Outcome::Unsimulated:
        ++n.refused;
        break;
      case Evaluated::Outcome::Fits:
        ++n.fitting;
        break;
      }
      done[i] = std::move(e);
      if (progress)
        progress(n, toCompile, secondsSince(start));
    }
  };
  int jobs = std::max(1, options.jobs);
  std::vector<std::thread> threads;
  for (int j = 1; j < jobs; ++j)
    threads.emplace_back(work);
  work();
  for (std::thread &t : threads)
    t.join();
  result.timedOut = timedOut;
  for (std::optional<Evaluated> &e : done)
    if (e) {
      result.compiled.push_back(*e);
      if (e->outcome == Evaluated::Outcome::Fits)
        result.ranked.push_back(std::move(*e));
    }
  std::stable_sort(result.ranked.begin(), result.ranked.end(),
                   [](const Evaluated &a, const Evaluated &b) {
                     if (a.stepSeconds != b.stepSeconds)
                       return a.stepSeconds < b.stepSeconds;
                     return a.candidate.index < b.candidate.index;
                   });
  return result;
}

std::string search::formatTable(const SearchResult &result,
                                const SearchOptions &options, int64_t top) {
  const ModelFacts &facts = result.facts;
  auto gib = [](double bytes) { return bytes / double(1ull << 30); };
  std::string out = llvm::formatv(
      "{0,-4} {1,-26} {2,-20} {3,4} {4,4} {5,-9} {6,10} {7,12} {8,6} {9,6} "
      "{10,10} {11,10}\n",
      "rank", "layout", "schedule", "mb", "zero", "recompute", "step",
      "tokens/s", "MFU", "bubble", "peak GiB", "spare GiB");
  // The model's FLOPs per step: 3x the forward (forward and backward) for
  // every microbatch of every replica; recomputation is not counted.
  double stepFlops =
      3 * facts.forwardFlops * double(options.globalBatch / facts.batch);
  double tokens = double(options.globalBatch * facts.seq);
  for (auto [i, e] : llvm::enumerate(result.ranked)) {
    if (int64_t(i) >= top)
      break;
    const StrategyFlags &f = e.candidate.flags;
    std::string schedule = f.schedule;
    if (f.pp > 1 && f.virtualStages > 1)
      schedule += llvm::formatv(" v{0}", f.virtualStages).str();
    if (f.bucketMb != kDefaultBucketMb)
      schedule += llvm::formatv(" b{0}", f.bucketMb).str();
    double mfu = options.machine.peakFlopsPerSecond > 0
                     ? stepFlops / (e.stepSeconds * double(options.devices) *
                                    options.machine.peakFlopsPerSecond)
                     : 0;
    out += llvm::formatv(
        "{0,-4} {1,-26} {2,-20} {3,4} {4,4} {5,-9} {6,10} {7,12:F0} "
        "{8,5:F1}% {9,5:F1}% {10,10:F2} {11,10:F2}\n",
        i + 1, layoutName(f), schedule, f.microbatches, f.zero, f.recompute,
        ::piper::plan::formatSeconds(e.stepSeconds), tokens / e.stepSeconds,
        100 * mfu, 100 * e.bubble, gib(double(e.peakBytes)),
        gib(double(options.deviceMemory - e.peakBytes)));
  }
  return out;
}
