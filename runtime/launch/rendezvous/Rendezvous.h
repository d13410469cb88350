// How piper-run's launcher and its ranks find each other: the PIPER_*
// environment variables, the rendezvous folder and the failure pipe.
#ifndef PIPER_RUNTIME_LAUNCH_RENDEZVOUS_RENDEZVOUS_H
#define PIPER_RUNTIME_LAUNCH_RENDEZVOUS_RENDEZVOUS_H

#include <string>
#include <vector>

#include "runtime/launch/rendezvous/LaunchEnv.h"
#include "support/Status.h"

namespace piper::runtime {

/// Reads an integer environment variable. False when it is unset, empty or
/// malformed; a malformed one also sets `error`.
bool envInt(const char *name, long long &value, std::string &error);

/// The job id of a local launch: PIPER_JOB_ID when set, else a random
/// "local-<16 hex digits>" that it then sets, so that every rank, restart
/// and spare the launcher starts inherits it.
std::string localJobId();

/// Creates a fresh, empty rendezvous folder under $TMPDIR (else /tmp).
Status makeStoreDir(std::string &dir);

/// The environment of every rank a launcher spawns: the launcher's own,
/// without the variables of this protocol, and with OPENBLAS_NUM_THREADS
/// sharing the cores out among `nproc` ranks unless the user chose.
std::vector<std::string> inheritedEnvironment(int nproc);

/// `base` plus the variables that tell a spawned process it is `rank` of
/// `worldSize`, where to meet (`storeDir`) and where to report a failure
/// (the pipe's write end `failureFd`).
std::vector<std::string> rankEnvironment(std::vector<std::string> base,
                                         int rank, int worldSize,
                                         const std::string &storeDir,
                                         int failureFd);

/// Makes this rank report its failures on the launcher's pipe, when it was
/// started by one (PIPER_FAILURE_FD); otherwise failures are only printed.
void initFailureReport(int rank);

/// Tells the launcher that this rank is about to exit on an error (once;
/// async-signal-safe).
void reportFailure();

/// Called by exitRank before it reports a failure (once: exitRank clears
/// it first); the watchdog records the verdict and prints its report there.
using ExitHook = void (*)(const std::string &message);
void setExitHook(ExitHook hook);

/// Reports the failure, prints "piper-run: <message>" on stderr and exits
/// with `code` at once: tearing down a communicator whose peers are stuck
/// or gone could block, and the launcher is waiting to stop them.
[[noreturn]] void exitRank(const std::string &message, int code = 1);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_RENDEZVOUS_RENDEZVOUS_H
