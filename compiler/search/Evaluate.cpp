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
    // The verifier after every pass re-walks the whole program (a third of
    // a large compile); the passes are verified by their tests, and
    // `piperc compile --strategy` of a printed file verifies again.
    pm.enableVerifier(false);
    addCompilePipeline(pm, *strategy, options.opt, CompilePhase::Plan);
    FailureOr<LoweredPlans> lowered = failure();
    // The plans' progress is checked by the simulation below, on the
    // machine, instead of once more inside the lowering.
    if (succeeded(pm.run(*module)))
      lowered = lowerToPlans(*module, "search", strategy->summary,
                             /*checkProgress=*/false, options.opt.fuseEpilogues,
                             options.opt.padVocab);
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
    for (const ::piper::plan::ClassTime &c : sim.classes) {
      e.bubble = std::max(e.bubble, c.bubbleFraction);
      for (const ::piper::plan::StreamTime &st : c.streams)
        e.busiestStream = std::max(e.busiestStream, st.busy);
    }
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

/// Worker threads over a list of candidates, with the shared counts, the
/// progress and the time limit.
class Pool {
public:
  Pool(llvm::StringRef modelText, const SearchOptions &options,
       std::chrono::steady_clock::time_point start, const Progress &progress,
       SearchCounts &counts)
      : modelText(modelText), options(options), start(start),
        progress(progress), counts(counts) {}

  /// Evaluates the first `n` of `items` on options.jobs threads; an entry
  /// is empty when the time limit stopped it.
  std::vector<std::optional<Evaluated>> run(const std::vector<Candidate> &items,
                                            int64_t n) {
    std::vector<std::optional<Evaluated>> done(n);
    std::atomic<int64_t> next{0};
    std::mutex mutex;
    auto work = [&] {
      Worker worker(modelText, options);
      if (!worker.ready())
        return;
      while (true) {
        int64_t i = next++;
        if (i >= n)
          return;
        if (options.timeLimit > 0 && secondsSince(start) > options.timeLimit) {
          stopped = true;
          return;
        }
        Evaluated e = worker.evaluate(items[i]);
        std::lock_guard<std::mutex> lock(mutex);
        ++counts.compiled;
        switch (e.outcome) {
        case Evaluated::Outcome::Refused:
        case Evaluated::Outcome::Unsimulated:
          ++counts.refused;
          break;
        case Evaluated::Outcome::TooBig:
          ++counts.tooBig;
          break;
        case Evaluated::Outcome::Fits:
          ++counts.fitting;
          break;
        }
        done[i] = std::move(e);
        if (progress)
          progress(counts, options.maxCompiles, secondsSince(start));
      }
    };
    int jobs = std::max<int>(1, std::min<int64_t>(options.jobs, n));
    std::vector<std::thread> threads;
    for (int j = 1; j < jobs; ++j)
      threads.emplace_back(work);
    work();
    for (std::thread &t : threads)
      t.join();
    return done;
  }

  bool timedOut() const { return stopped; }

private:
  llvm::StringRef modelText;
  const SearchOptions &options;
  std::chrono::steady_clock::time_point start;
  const Progress &progress;
  SearchCounts &counts;
  std::atomic<bool> stopped{false};
};
} // namespace

int64_t search::proxyMicrobatches(const StrategyFlags &f) {
  const ScheduleBuilder *schedule = findSchedule(f.schedule);
  int64_t v =
      f.virtualStages > 0 ? f.virtualStages : defaultStagesPerDevice(*schedule);
  // Every microbatch adds the same tasks, so the step's growth per
  // microbatch shows from the smallest count the schedule accepts from pp
  // (a whole pipeline of them), used when it at least halves the compile;
  // the peak of a deeper warm-up than pp is checked by the whole compile of
  // phase 2.
  for (int64_t m = std::max<int64_t>(2, f.pp); 2 * m <= f.microbatches; ++m)
    if (schedule->check(f.pp, v, m).empty() &&
        checkStageMicrobatches(f.pp * v, m).empty())
      return m;
  return 0;
}

void search::extrapolate(Evaluated &e, const SearchOptions &options) {
  const int64_t m = e.candidate.flags.microbatches, m1 = e.proxyMicrobatches;
  if (e.outcome != Evaluated::Outcome::Fits)
    return;
  // Each further microbatch adds the busiest stream's time per microbatch.
  e.stepSeconds += double(m - m1) * e.busiestStream / double(m1);
  if (e.candidate.flags.schedule == "gpipe")
    e.peakBytes =
        e.stateBytes + static_cast<int64_t>(double(e.peakBytes - e.stateBytes) *
                                            double(m) / double(m1));
  if (e.peakBytes > options.deviceMemory) {
    e.outcome = Evaluated::Outcome::TooBig;
    e.why = llvm::formatv("needs about {0} bytes (extrapolated from {1} "
                          "microbatches to {2})",
                          e.peakBytes, m1, m)
                .str();
  }
}

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
  const int64_t toScreen =
      std::min<int64_t>(options.maxCompiles, candidates.size());
  // Phase 1: every candidate of the budget, a long one through its proxy.
  std::vector<Candidate> screen(candidates.begin(),
                                candidates.begin() + toScreen);
  std::vector<int64_t> proxied(toScreen, 0);
  for (int64_t i = 0; i < toScreen; ++i)
    if (int64_t m = proxyMicrobatches(screen[i].flags)) {
      proxied[i] = m;
      screen[i].flags.microbatches = m;
    }
  Pool pool(modelText, options, start, progress, result.counts);
  std::vector<std::optional<Evaluated>> screened = pool.run(screen, toScreen);
  result.timedOut = pool.timedOut();
  // Each proxy's result stands for its candidate: the step extrapolated,
  // the peak kept (GPipe's activations grown with the microbatches).
  std::vector<Evaluated> provisional;
  for (int64_t i = 0; i < toScreen; ++i) {
    if (!screened[i])
      continue;
    Evaluated e = std::move(*screened[i]);
    e.candidate = candidates[i];
    e.proxyMicrobatches = proxied[i];
    if (proxied[i])
      extrapolate(e, options);
    result.compiled.push_back(e);
    if (e.outcome == Evaluated::Outcome::Fits)
      provisional.push_back(std::move(e));
  }
  auto faster = [](const Evaluated &a, const Evaluated &b) {
    if (a.stepSeconds != b.stepSeconds)
      return a.stepSeconds < b.stepSeconds;
    return a.candidate.index < b.candidate.index;
  };
  std::stable_sort(provisional.begin(), provisional.end(), faster);
  // Phase 2: in that order, each proxied candidate compiled whole (its exact
  // plan and step), until `top` are known exactly; the order does not
  // depend on the number of jobs.
  size_t at = 0;
  while (at < provisional.size() &&
         int64_t(result.ranked.size()) < options.top && !pool.timedOut()) {
    std::vector<Candidate> batch;
    std::vector<size_t> where;
    // The next candidates that could fill the missing rows, compiled at
    // once on the pool's threads (a whole compile can take 30 s, so no
    // thread waits for another's batch): none past the last row they could
    // fill, so no more compiles than one at a time would make.
    int64_t missing = options.top - int64_t(result.ranked.size());
    for (size_t j = at; j < provisional.size() && missing > 0; ++j, --missing) {
      where.push_back(j);
      if (provisional[j].proxyMicrobatches)
        batch.push_back(provisional[j].candidate);
    }
    std::vector<std::optional<Evaluated>> whole =
        pool.run(batch, int64_t(batch.size()));
    size_t next = 0;
    for (size_t j : where) {
      if (int64_t(result.ranked.size()) >= options.top)
        break;
      at = j + 1;
      if (!provisional[j].proxyMicrobatches) {
        result.ranked.push_back(provisional[j]);
        continue;
      }
      std::optional<Evaluated> &e = whole[next++];
      if (!e)
        break;
      ++result.counts.confirmed;
      result.compiled.push_back(*e);
      if (e->outcome == Evaluated::Outcome::Fits)
        result.ranked.push_back(*e);
    }
  }
  result.timedOut = pool.timedOut();
  std::stable_sort(result.ranked.begin(), result.ranked.end(), faster);
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
