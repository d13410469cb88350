// The local launcher's child processes: starting one (fork + exec of this
// executable), describing how one ended, and stopping a set of them.
#ifndef PIPER_RUNTIME_LAUNCH_SUPERVISION_CHILDREN_H
#define PIPER_RUNTIME_LAUNCH_SUPERVISION_CHILDREN_H

#include <map>
#include <string>
#include <vector>

#include <sys/types.h>

namespace piper::runtime {

/// Starts this executable (/proc/self/exe) with `argv` and `envp`: the child
/// dies with the launcher, keeps the descriptors `inherit` across exec, and
/// writes its stderr to `stderrFd` when it is not -1. Everything it touches
/// after fork is prepared by the caller (the launcher may have threads).
/// Returns the pid, or -1 (errno set).
pid_t spawnSelf(char **argv, char **envp, int stderrFd,
                const std::vector<int> &inherit);

/// "exit code 4", "killed by signal 9, Killed", "exit code 5 (its log
/// could not be written...)".
std::string describeExit(int status);

/// Whether `status` (of waitpid) is anything but exit code 0.
bool exitedWithFailure(int status);

/// Reaps, without blocking, the children of `alive` (pid -> id) that have
/// exited: each moves to `statuses` (id -> status) and, when it failed, is
/// appended to `failedOrder`. Only the pids of `alive` are waited for.
void reapChildren(std::map<pid_t, int> &alive, std::map<int, int> &statuses,
                  std::vector<int> *failedOrder = nullptr);

/// Sends SIGTERM to every child of `alive`, then SIGKILL to those still
/// alive after `graceMs`, and reaps them all into `statuses` (by id).
void stopChildren(std::map<pid_t, int> &alive, std::map<int, int> &statuses,
                  int graceMs = 5000);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_SUPERVISION_CHILDREN_H
