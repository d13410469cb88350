// piper-run: runs a compiled strategy on local CPU processes, as a launcher
// that spawns and supervises the ranks or as one rank started by env vars.
#ifndef PIPER_RUNTIME_LAUNCH_PIPERRUN_H
#define PIPER_RUNTIME_LAUNCH_PIPERRUN_H

namespace piper::runtime {

/// The whole piper-run command (docs/piper-run.md): picks OpenBLAS's
/// kernels (BlasCore.h), parses `argv` (RunOptions.h); with PIPER_RANK in
/// the environment runs that one rank (RunRank.h), otherwise checks the
/// strategy (StrategyFiles.h) and spawns --nproc ranks (Spawn.h). Returns
/// the process exit code.
int piperRunMain(int argc, char **argv);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_PIPERRUN_H
