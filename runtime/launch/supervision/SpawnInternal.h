// Internal to runtime/launch's launcher (Spawn.h): what one generation of
// ranks needs from the run (Launch), what it is told (Generation) and how it
// ends (AttemptEnd). Spawn.cpp runs the generations (spares, restarts);
// SpawnGeneration.cpp spawns and supervises one of them.
#ifndef PIPER_RUNTIME_LAUNCH_SUPERVISION_SPAWNINTERNAL_H
#define PIPER_RUNTIME_LAUNCH_SUPERVISION_SPAWNINTERNAL_H

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/launch/options/RunOptions.h"
#include "runtime/launch/supervision/StandbyLauncher.h"

namespace piper::runtime::spawn_detail {

using Clock = std::chrono::steady_clock;

inline double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// What stays the same across the generations of ranks of one run.
struct Launch {
  explicit Launch(const RunOptions &options) : options(options) {}
  const RunOptions &options;
  /// The failure pipe: ranks (and promoted spares) write "R\n" to it.
  int failureRead = -1, failureWrite = -1;
  /// The launcher's environment for every child.
  std::vector<std::string> baseEnv;
  /// --standby: the parked spares, and the folder of the states handed off
  /// (gen-<A>/rank-<R>/step-<S>/) and of the recovery links
  /// (recovery-<A>/class-<C>-member-<M>).
  Spares spares;
  std::string standbyRoot;
  /// Why the ranks hand no state off (a ZeRO-sharded class: no replica
  /// holds a copy of another's shard); empty when they do.
  std::string noHandoff;
  /// Per device class: its tensor-parallel members (each holds its own
  /// slices, copied from the same member of another data replica).
  std::vector<int64_t> tensorParallel;

  std::string handoffDir(int attempt) const {
    return standbyRoot.empty()
               ? std::string()
               : fmt::format("{}/gen-{}", standbyRoot, attempt);
  }
};

/// One launch of the ranks.
struct Generation {
  /// 0 for the first; PIPER_ATTEMPT.
  int attempt = 0;
  /// When the previous generation failed (steady clock), -1 for the first.
  long long failedAtNs = -1;
  char **argv = nullptr;
  /// argv has --resume (a promoted spare is told so).
  bool resume = false;
  /// The state of every class, from surviving replicas (kRecoveryDirVar).
  std::string recoveryDir;
  /// The rank whose place a spare takes, -1 for none.
  int promotedRank = -1;
  /// What the launcher says when it promotes the spare (the state's source).
  std::string recoveryText;
};

/// How one generation of the ranks ended.
struct AttemptEnd {
  int exitCode = 0;
  /// A rank failed (not an interruption, not a launcher error): a spare or
  /// a restart may follow.
  bool rankFailed = false;
  /// When the launcher first saw the failure.
  Clock::time_point failedAt;
  /// The rank that failed first, and every rank whose state is not to be
  /// trusted (it, and any other that failed on its own).
  int culprit = -1;
  std::set<int> lost;
  /// The watchdog could not tell the culprit (Abort::guess): no spare.
  bool guessed = false;
};

/// Makes SIGINT, SIGTERM and SIGHUP stop the running generation (its ranks
/// are stopped, and launchGeneration returns 128 + the signal).
void catchStopSignals();

/// Launches generation `gen` of the ranks and supervises it to the end.
AttemptEnd launchGeneration(Launch &launch, const Generation &gen);

} // namespace piper::runtime::spawn_detail

#endif // PIPER_RUNTIME_LAUNCH_SUPERVISION_SPAWNINTERNAL_H
