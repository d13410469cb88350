// piper-run's launcher across generations of local ranks: the failure pipe,
// the children's environment and the spares shared by every generation;
// after a rank fails, the next generation (a spare in its place, or every
// rank afresh) from the state of a surviving replica or the newest
// checkpoint. One generation is spawned and supervised by
// SpawnGeneration.cpp.
#include "runtime/launch/supervision/Spawn.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "proto/PlanShards.h"
#include "runtime/launch/checkpoints/StrategyFiles.h"
#include "runtime/launch/rendezvous/Rendezvous.h"
#include "runtime/launch/supervision/SpawnInternal.h"
#include "runtime/launch/supervision/StandbyLauncher.h"
#include "support/Errno.h"

namespace piper::runtime {

using namespace spawn_detail;

namespace {

long long nanosOf(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             t.time_since_epoch())
      .count();
}

/// Makes what every generation shares: the failure pipe, the children's
/// environment, the stop signals' handler and, with --standby, the parked
/// spares. False (the problem printed, nothing left open) on failure.
bool prepareLaunch(Launch &launch, const plan::Manifest &manifest,
                   char **argv) {
  const RunOptions &options = launch.options;
  // Ranks write "R\n" to this pipe just before they exit on an error. A
  // rank that dies makes its peers fail within microseconds, often before
  // the dying process is reapable, so the first line, not the first exit,
  // names the rank that failed first. One pipe serves every generation.
  int failurePipe[2];
  if (::pipe2(failurePipe, O_CLOEXEC) != 0) {
    fmt::print(stderr, "piper-run: cannot create a pipe: {}\n",
               errnoMessage(errno));
    return false;
  }
  ::fcntl(failurePipe[0], F_SETFL, O_NONBLOCK);
  launch.failureRead = failurePipe[0];
  launch.failureWrite = failurePipe[1];
  // Everything a child needs is built before fork: after it, the child may
  // only make async-signal-safe calls (the parent may have BLAS threads).
  launch.baseEnv = inheritedEnvironment(options.nproc);
  catchStopSignals();

  if (options.standby > 0) {
    std::vector<plan::Plan> plans;
    Status st = loadPlans(options, manifest, plans);
    launch.noHandoff = shardedStateNote(plans);
    for (const plan::Plan &plan : plans)
      launch.tensorParallel.push_back(plan::tensorParallel(plan));
    if (st)
      st = makeStoreDir(launch.standbyRoot);
    if (st)
      st = launch.spares.start(options, argv, launch.baseEnv,
                               launch.failureWrite);
    if (!st) {
      fmt::print(stderr, "piper-run: --standby: {}\n", st.message());
      launch.spares.release();
      ::close(launch.failureRead);
      ::close(launch.failureWrite);
      return false;
    }
  }
  return true;
}

/// Releases what prepareLaunch made and returns `code`.
int finishLaunch(Launch &launch, int code) {
  launch.spares.release();
  if (!launch.standbyRoot.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(launch.standbyRoot, ec);
  }
  ::close(launch.failureRead);
  ::close(launch.failureWrite);
  return code;
}

/// With --standby, where generation `next` takes its state from after
/// generation `gen` ended with `end`: the survivors' handed-off state
/// (next runs `argv` without --resume), or else the newest checkpoint, its
/// description in `source`. False (printed) when there is neither.
bool recoverFromReplicas(Launch &launch, const plan::Manifest &manifest,
                         const Generation &gen, const AttemptEnd &end,
                         char **argv, Generation &next, std::string &source) {
  const RunOptions &options = launch.options;
  // The states the survivors handed off; those of the generation before
  // are no longer needed.
  std::error_code ec;
  if (gen.attempt > 0) {
    std::filesystem::remove_all(launch.handoffDir(gen.attempt - 1), ec);
    std::filesystem::remove_all(
        fmt::format("{}/recovery-{}", launch.standbyRoot, gen.attempt), ec);
  }
  Recovery recovery;
  recovery.why = launch.noHandoff;
  Status st = Status::ok();
  if (launch.noHandoff.empty())
    st = planRecovery(
        manifest, launch.tensorParallel, launch.handoffDir(gen.attempt),
        end.lost,
        fmt::format("{}/recovery-{}", launch.standbyRoot, next.attempt),
        recovery);
  if (!st) {
    fmt::print(stderr, "piper-run: --standby: {}\n", st.message());
    return false;
  }
  if (recovery.fromReplicas) {
    next.argv = argv;
    next.resume = false;
    next.recoveryDir = recovery.dir;
    int from = recovery.sourceOf.count(end.culprit)
                   ? recovery.sourceOf[end.culprit]
                   : -1;
    source = fmt::format("state of step {} from its replica rank {}",
                         recovery.step, from);
  } else if (options.checkpointDir.empty()) {
    fmt::print(stderr,
               "piper-run: cannot continue after rank {} failed: {}, and "
               "there is no --checkpoint-dir to resume from\n",
               end.culprit, recovery.why);
    return false;
  } else {
    source += fmt::format(" ({})", recovery.why);
  }
  return true;
}

/// Says that restart `restarts` relaunches every rank from `source`.
void announceRestart(const RunOptions &options, int restarts,
                     const std::string &source, const AttemptEnd &end) {
  if (options.standby > 0)
    fmt::print(stderr,
               "piper-run: restart {} of {}: relaunching {} ranks, {} "
               "({:.2f} s after the failure)\n",
               restarts, options.maxRestarts, options.nproc, source,
               secondsSince(end.failedAt));
  else
    fmt::print(stderr,
               "piper-run: restart {} of {}: relaunching {} ranks from "
               "the newest checkpoint of '{}' ({:.2f} s after the "
               "failure)\n",
               restarts, options.maxRestarts, options.nproc,
               options.checkpointDir, secondsSince(end.failedAt));
}

} // namespace

int launchLocalRanks(const RunOptions &options,
                     const plan::Manifest &manifest, char **argv) {
  Launch launch(options);
  if (!prepareLaunch(launch, manifest, argv))
    return 1;

  // Restarts from a checkpoint: the same command line plus --resume
  // (--steps is then the total, so a restarted run ends where the first
  // would have).
  std::vector<char *> resumeArgv;
  for (char **a = argv; *a; ++a)
    resumeArgv.push_back(*a);
  static char resumeFlag[] = "--resume";
  if (!options.resume)
    resumeArgv.push_back(resumeFlag);
  resumeArgv.push_back(nullptr);

  Generation gen;
  gen.argv = argv;
  int restarts = 0;
  while (true) {
    AttemptEnd end = launchGeneration(launch, gen);
    if (!end.rankFailed)
      return finishLaunch(launch, end.exitCode);
    launch.spares.reapExited();
    if (end.guessed && launch.spares.left() > 0)
      fmt::print(stderr,
                 "piper-run: --standby: no spare replaces rank {}: the "
                 "watchdog could not tell which rank failed\n",
                 end.culprit);
    const bool spare = launch.spares.left() > 0 && !end.guessed;
    if (!spare && restarts >= options.maxRestarts) {
      if (options.standby > 0 && launch.spares.left() == 0)
        fmt::print(stderr, "piper-run: no standby left ({} of {} used)\n",
                   launch.spares.used(), launch.spares.total());
      if (options.maxRestarts > 0)
        fmt::print(stderr, "piper-run: no restart left ({} of {} used)\n",
                   restarts, options.maxRestarts);
      return finishLaunch(launch, end.exitCode);
    }

    Generation next;
    next.attempt = gen.attempt + 1;
    next.failedAtNs = nanosOf(end.failedAt);
    next.argv = resumeArgv.data();
    next.resume = true;
    std::string source = fmt::format(
        "every rank resuming from the newest checkpoint of '{}'",
        options.checkpointDir);
    if (options.standby > 0 &&
        !recoverFromReplicas(launch, manifest, gen, end, argv, next, source))
      return finishLaunch(launch, end.exitCode);
    next.recoveryText = source;
    if (spare) {
      next.promotedRank = end.culprit;
    } else {
      ++restarts;
      announceRestart(options, restarts, source, end);
    }
    gen = next;
  }
}

} // namespace piper::runtime
