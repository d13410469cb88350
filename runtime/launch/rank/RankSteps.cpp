// The training steps of a rank (RankRun.h), then what follows the last:
// trace parts, peak memory, reports and the saved files.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "proto/PlanShards.h"
#include "runtime/launch/checkpoints/CheckpointIO.h"
#include "runtime/launch/rank/RankRun.h"
#include "runtime/launch/rank/Trace.h"

namespace piper::runtime {

namespace {

/// Tokens of one step over all replicas (for tokens/s): from the manifest's
/// training config, else the plan's.
double tokensPerStep(const plan::Manifest &manifest, const plan::Plan &plan) {
  const plan::TrainingConfig &t = manifest.training().num_microbatches() > 0
                                      ? manifest.training()
                                      : plan.training();
  return double(plan::globalMicrobatches(t)) * t.microbatch_size() *
         t.seq_len();
}

/// The peak arena memory of every rank, indexed by rank: this rank's
/// `peakBytes` gathered through a world sum (exact below 2^53 bytes).
Status peakBytesPerRank(Communicator *comm, int rank, int worldSize,
                        int64_t peakBytes, std::vector<int64_t> &out) {
  std::vector<double> slots(worldSize, 0.0);
  slots[rank] = double(peakBytes);
  if (comm)
    PIPER_RETURN_IF_ERROR(comm->allReduceSumWorld(slots.data(), slots.size())
                              .withContext("gathering peak memory"));
  out.assign(slots.begin(), slots.end());
  return Status::ok();
}

} // namespace

void RankRun::train() {
  long long failRank = -1, failStep = -1;
  std::string envError;
  if (!envInt("PIPER_TEST_FAIL_RANK", failRank, envError) ||
      !envInt("PIPER_TEST_FAIL_STEP", failStep, envError))
    failRank = failStep = -1;
  if (!envError.empty())
    exitRank(who + ": " + envError);

  // What a run cut off while writing a checkpoint left (no rank writes
  // there before the first step).
  if (rank == 0 && !options.checkpointDir.empty())
    removeIncompleteCheckpoints(options.checkpointDir);

  if (rank == 0 && !options.metricsPath.empty()) {
    // A resumed run continues the metrics of the steps it keeps.
    if (continuing)
      check(keepMetricsUpTo(options.metricsPath, loadedStep));
    check(metrics.open(options.metricsPath, continuing));
  }
  tokens = tokensPerStep(manifest, plan);

  if (continuing && rank == 0 && loadedStep >= options.steps)
    fmt::print(stderr,
               "piper-run: --resume: step {} reached --steps {}, no step "
               "to run\n",
               loadedStep, options.steps);
  // After a restart (--max-restarts): when the launcher saw the failure.
  long long failedAtNs = -1;
  std::string failedAtError;
  if (!envInt("PIPER_RESTART_FAILED_AT_NS", failedAtNs, failedAtError))
    failedAtNs = -1;
  progress = std::make_unique<Progress>(loadedStep + 1, lastStep,
                                        options.logEvery, tokens);
  if (rank == 0 && exec->peakFlops() > 0) {
    // MFU needs every class's parameters; only a backend that knows its
    // peak pays for reading them.
    std::vector<plan::Plan> plans;
    check(allPlans(plans));
    progress->setFlops(modelFlopsPerStep(plans, tokens),
                       exec->peakFlops() * env.worldSize);
  }
  // --profile leaves out the first step (allocator and BLAS warm-up) unless
  // it is the only one.
  profiledFrom = loadedStep + 1;
  profiledSeconds = 0;
  for (int64_t step = loadedStep + 1; step <= lastStep; ++step) {
    if (rank == failRank && step == failStep)
      exitRank(fmt::format("{}: failing at the start of step {} on purpose "
                           "(PIPER_TEST_FAIL_RANK/PIPER_TEST_FAIL_STEP)",
                           who, step),
               3);
    auto start = Clock::now();
    double loss = 0;
    Status stepStatus = exec->runStep(step, loss);
    if (!stepStatus && watchdog)
      watchdog->streamFailed(stepStatus);
    check(stepStatus, /*named=*/false);
    double seconds =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (snapshots)
      check(snapshots->take(*exec, step), /*named=*/false);
    if (options.checkpointEvery > 0 && step % options.checkpointEvery == 0) {
      CheckpointStats stats;
      CheckpointHooks hooks;
      if (faulty)
        hooks.filesWritten = checkpointFault(fault, rank, step);
      if (watchdog) {
        // A barrier that fails here most likely met a peer's failure: the
        // watchdog names that rank, as in a step.
        watchdog->setActivity(fmt::format("checkpoint step {}", step));
        hooks.collectiveFailed = [this](const Status &st) {
          watchdog->collectiveFailed(st);
        };
      }
      check(writeStepCheckpoint(options.checkpointDir, options.keepCheckpoints,
                                identity, manifest, *exec, comm.get(), rank,
                                step, stats, hooks),
            /*named=*/false);
      if (watchdog)
        watchdog->setActivity("");
      if (rank == 0)
        fmt::print(stderr,
                   "piper-run: checkpoint '{}' written: {:.2f} MB in {:.3f} "
                   "s\n",
                   checkpointStepDir(options.checkpointDir, step),
                   stats.bytes / 1e6, stats.seconds);
    }
    if (rank == 0 && failedAtNs >= 0 && step == loadedStep + 1) {
      auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     Clock::now().time_since_epoch())
                     .count();
      const char *note = std::getenv(kRecoveryNoteVar);
      fmt::print(stderr,
                 "piper-run: {}training again: step {} done {:.2f} s after "
                 "the failure\n",
                 note && *note ? std::string(note) + "; " : std::string(), step,
                 (now - failedAtNs) / 1e9);
    }
    if (eo.profile && step == loadedStep + 1 && lastStep > step) {
      exec->resetProfile();
      profiledFrom = step + 1;
    } else {
      profiledSeconds += seconds;
    }
    if (rank != 0)
      continue;
    StepReport report;
    report.step = step;
    report.loss = loss;
    report.stepSeconds = seconds;
    report.tokensPerS = seconds > 0 ? tokens / seconds : 0.0;
    report.lr = exec->plan().training().lr() * exec->lrScale(step);
    report.gradNorm = exec->lastGradNorm();
    report.peakBytes = exec->peakBytes();
    report.maxRssBytes = maxRssBytes();
    std::string line = progress->record(report);
    if (!line.empty()) {
      fmt::print("{}\n", line);
      std::fflush(stdout);
    }
    check(metrics.write(report));
  }
}

void RankRun::finish() {
  // --trace: every rank hands in its part before the world collective
  // below, which is thus the barrier after which rank 0 finds them all.
  std::string tracePart;
  if (tracedStep > 0) {
    tracePart =
        traceRankPart(exec->plan(), rank, hostName(), exec->stepTrace());
    if (traceStore && rank != 0)
      check(traceStore->put(traceKey(rank), tracePart)
                .withContext("--trace: handing in its part"));
  }
  // A world collective, even after no steps: it is then the barrier that
  // keeps a rank from exiting while a peer still connects to it.
  std::vector<int64_t> peaks;
  Status gathered = peakBytesPerRank(comm.get(), rank, env.worldSize,
                                     exec->peakBytes(), peaks);
  if (!gathered && watchdog)
    watchdog->streamFailed(gathered);
  check(gathered);
  if (watchdog)
    watchdog->finish();
  check(metrics.close());
  if (reports) {
    if (eo.profile && lastStep >= profiledFrom)
      fmt::print(stderr, "{}",
                 profileTable(who, *exec, profiledFrom,
                              lastStep - profiledFrom + 1, profiledSeconds));
    fmt::print(stderr, "{}", memoryReport(who, *exec));
    fmt::print(stderr, "{}", packedReport(who, *exec));
    if (exec->capturedSteps() > 0)
      fmt::print(stderr,
                 "piper-run: {}: steps as graphs: {} captured, {} launched "
                 "again\n",
                 who, exec->capturedSteps(), exec->replayedSteps());
    std::fflush(stderr);
  }

  if (!options.saveParamsDir.empty() &&
      (exec->replicaIndex() == 0 || exec->shardsState()))
    check(exec->saveParams(options.saveParamsDir), /*named=*/false);
  if (!options.savePath.empty())
    check(writeCheckpoint(options.savePath, CheckpointContent::Params, manifest,
                          *exec, comm.get(), rank, lastStep),
          /*named=*/false);
  if (!options.saveHfDir.empty()) {
    // Every class's parameters merged into one file, as --save's, which
    // rank 0 then writes out under their Hugging Face names.
    const std::string merged = options.saveHfDir + "/.piper-export.safetensors";
    check(writeCheckpoint(merged, CheckpointContent::Params, manifest, *exec,
                          comm.get(), rank, lastStep),
          /*named=*/false);
    if (rank == 0) {
      std::vector<plan::Plan> plans;
      Status st = allPlans(plans);
      if (st)
        st = exportHfFolder(options.saveHfDir, merged, manifest, plans,
                            options.hfDType, options.hfShardBytes);
      std::remove(merged.c_str());
      check(st, /*named=*/false);
    }
  }
  if (!options.saveGradsPath.empty())
    check(writeCheckpoint(options.saveGradsPath, CheckpointContent::Gradients,
                          manifest, *exec, comm.get(), rank, lastStep),
          /*named=*/false);
  if (tracedStep > 0 && rank == 0)
    check(writeMeasuredTrace(options.tracePath, traceStore.get(), env.worldSize,
                             tracePart));
  if (rank == 0) {
    double wall =
        std::chrono::duration<double>(Clock::now() - runStart).count();
    fmt::print("{}", progress->summary(peaks, wall));
    std::fflush(stdout);
  }
}

} // namespace piper::runtime
