// piper-run's main: one rank or the launcher of all of them.
#include "runtime/launch/PiperRun.h"

#include <memory>
#include <vector>

#include <fmt/format.h>

#include "runtime/launch/BlasCore.h"
#include "runtime/launch/checkpoints/CheckpointLock.h"
#include "runtime/launch/checkpoints/StrategyFiles.h"
#include "runtime/launch/options/RunOptions.h"
#include "runtime/launch/rank/RunRank.h"
#include "runtime/launch/rank/Standby.h"
#include "runtime/launch/rendezvous/Rendezvous.h"
#include "runtime/launch/supervision/Spawn.h"
#include "runtime/launch/supervision/StandbyLauncher.h"
#include "runtime/launch/watchdog/Watchdog.h"

namespace piper::runtime {

int piperRunMain(int argc, char **argv) {
  // First, before anything reads the environment: this may re-execute the
  // process with OPENBLAS_CORETYPE set (ranks inherit it).
  useFastBlasCore(argv);

  RunOptions options;
  int exitCode = 0;
  if (!parseRunOptions(argc, argv, options, exitCode))
    return exitCode;

  // A spare the local launcher started (--standby): it parks.
  if (isStandby())
    return runStandby(options);
  bool isRank = false;
  RankEnv env;
  Status st = readRankEnv(options.nproc, isRank, env);
  if (!st) {
    fmt::print(stderr, "piper-run: {}\n", st.message());
    return 1;
  }
  if (isRank && options.standby > 0 && env.launcher != "piper-run") {
    fmt::print(stderr,
               "piper-run: --standby needs piper-run's local launcher (it "
               "starts the spares); under {} leave it out\n",
               env.launcher);
    return 2;
  }
  if (isRank)
    return runRank(options, env);

  plan::Manifest manifest;
  st = loadManifest(options, manifest);
  if (!st) {
    fmt::print(stderr, "piper-run: {}\n", st.message());
    return 1;
  }
  if (options.nproc <= 0) {
    fmt::print(stderr,
               "piper-run: --nproc is required (the strategy needs {} "
               "ranks), unless srun, mpirun or torchrun-style variables "
               "start the ranks (docs/operations.md)\n",
               manifest.world_size());
    return 1;
  }
  if (options.nproc != manifest.world_size()) {
    fmt::print(stderr, "piper-run: strategy needs {} ranks, --nproc is {}\n",
               manifest.world_size(), options.nproc);
    return 1;
  }
  // One job at a time in a --checkpoint-dir: the launcher holds the lock
  // for its whole life, restarts and spares included; a second job stops
  // here.
  std::string job = "piper-run:" + localJobId();
  std::unique_ptr<CheckpointDirLock> checkpointLock;
  if (!options.checkpointDir.empty()) {
    st = CheckpointDirLock::acquire(options.checkpointDir, job, checkpointLock);
    if (!st) {
      fmt::print(stderr, "piper-run: {}\n", st.message());
      return 1;
    }
  }
  // PIPER_FAULT's syntax is checked before any rank starts.
  FaultSpec fault;
  bool faulty = false;
  st = faultFromEnv(fault, faulty);
  if (st && faulty && fault.rank >= options.nproc)
    st = Status::error(
        fmt::format("PIPER_FAULT: rank {} is not one of the {} ranks",
                    fault.rank, options.nproc));
  if (st && faulty)
    st = checkFaultCheckpoint(fault, options.checkpointEvery);
  if (!st) {
    fmt::print(stderr, "piper-run: {}\n", st.message());
    return 2;
  }
  st = checkStrategy(options, manifest);
  if (!st) {
    fmt::print(stderr, "piper-run: {}\n", st.message());
    return 1;
  }
  std::vector<plan::Plan> plans;
  if (options.standby > 0)
    st = loadPlans(options, manifest, plans);
  if (st)
    st = checkStandbyState(options, manifest, plans);
  if (!st) {
    fmt::print(stderr, "piper-run: {}\n", st.message());
    return 1;
  }
  return launchLocalRanks(options, manifest, argv);
}

} // namespace piper::runtime
