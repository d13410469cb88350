// One rank of a piper-run: load its plan, connect, run the steps, report,
// save.
#ifndef PIPER_RUNTIME_LAUNCH_RANK_RUNRANK_H
#define PIPER_RUNTIME_LAUNCH_RANK_RUNRANK_H

#include <vector>

#include "proto/plan.pb.h"
#include "runtime/launch/options/RunOptions.h"
#include "runtime/launch/rendezvous/Rendezvous.h"

namespace piper::runtime {

/// The manifest and every plan, read and validated (a spare's, before it
/// knows which rank it will be).
struct LoadedStrategy {
  plan::Manifest manifest;
  std::vector<plan::Plan> plans;
};

/// Runs rank env.rank of env.worldSize, meeting the others through the file
/// store in env.storeDir. Returns the exit code; on an error it reports the
/// failure and exits the process at once (exitRank). `loaded`, when given,
/// holds the strategy already read (a promoted spare's).
int runRank(const RunOptions &options, const RankEnv &env,
            const LoadedStrategy *loaded = nullptr);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_RANK_RUNRANK_H
