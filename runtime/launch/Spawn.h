// piper-run's launcher: spawns the local ranks, supervises them and stops
// all of them at the first failure.
#ifndef PIPER_RUNTIME_LAUNCH_SPAWN_H
#define PIPER_RUNTIME_LAUNCH_SPAWN_H

#include "runtime/launch/RunOptions.h"

namespace piper::runtime {

/// Spawns options.nproc copies of this executable (fork + exec of
/// /proc/self/exe with `argv`, told their rank by env vars; see
/// Rendezvous.h), waits for them, and stops all of them as soon as one
/// fails, naming the rank that failed first. Returns the exit code.
int launchLocalRanks(const RunOptions &options, char **argv);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_SPAWN_H
