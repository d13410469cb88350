// piper-run's launcher: spawns the local ranks, supervises them and stops
// all of them at the first failure; spares and restarts.
#ifndef PIPER_RUNTIME_LAUNCH_SUPERVISION_SPAWN_H
#define PIPER_RUNTIME_LAUNCH_SUPERVISION_SPAWN_H

#include "proto/plan.pb.h"
#include "runtime/launch/options/RunOptions.h"

namespace piper::runtime {

/// Spawns options.nproc copies of this executable (fork + exec of
/// /proc/self/exe with `argv`, told their rank by env vars; see
/// Rendezvous.h), waits for them, and stops all of them as soon as one
/// fails, naming the rank that failed first. With --standby or
/// --max-restarts it then launches the next generation of ranks (a spare in
/// the failed rank's place, or all afresh), from the state of surviving
/// replicas or the newest checkpoint of `manifest`'s strategy. Returns the
/// exit code.
int launchLocalRanks(const RunOptions &options, const plan::Manifest &manifest,
                     char **argv);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_SUPERVISION_SPAWN_H
