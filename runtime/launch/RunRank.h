// One rank of a piper-run: load its plan, connect, run the steps, report,
// save.
#ifndef PIPER_RUNTIME_LAUNCH_RUNRANK_H
#define PIPER_RUNTIME_LAUNCH_RUNRANK_H

#include "runtime/launch/Rendezvous.h"
#include "runtime/launch/RunOptions.h"

namespace piper::runtime {

/// Runs rank env.rank of env.worldSize, meeting the others through the file
/// store in env.storeDir. Returns the exit code; on an error it reports the
/// failure and exits the process at once (exitRank).
int runRank(const RunOptions &options, const RankEnv &env);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_RUNRANK_H
