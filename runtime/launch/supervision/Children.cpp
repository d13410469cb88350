// The local launcher's child processes: fork + exec, exit statuses, and
// stopping them (SIGTERM, then SIGKILL).
#include "runtime/launch/supervision/Children.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/launch/rendezvous/LaunchEnv.h"

namespace piper::runtime {

pid_t spawnSelf(char **argv, char **envp, int stderrFd,
                const std::vector<int> &inherit) {
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid != 0)
    return pid;
  // Die with the launcher, so that no rank outlives a killed run.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent)
    ::_exit(1);
  // dup2 onto itself would not clear FD_CLOEXEC, so clear it by hand.
  for (int fd : inherit)
    ::fcntl(fd, F_SETFD, 0);
  if (stderrFd >= 0)
    ::dup2(stderrFd, STDERR_FILENO);
  ::execve("/proc/self/exe", argv, envp);
  const char msg[] = "piper-run: cannot exec /proc/self/exe\n";
  ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)ignored;
  ::_exit(127);
}

std::string describeExit(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == kExitLogLost)
    return fmt::format("exit code {}: its --log-dir log could not be written "
                       "(a full disk?), lines of it are missing",
                       kExitLogLost);
  if (WIFEXITED(status))
    return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char *name = strsignal(sig);
    return name ? fmt::format("killed by signal {}, {}", sig, name)
                : fmt::format("killed by signal {}", sig);
  }
  return fmt::format("status {}", status);
}

bool exitedWithFailure(int status) {
  return !WIFEXITED(status) || WEXITSTATUS(status);
}

void reapChildren(std::map<pid_t, int> &alive, std::map<int, int> &statuses,
                  std::vector<int> *failedOrder) {
  for (auto it = alive.begin(); it != alive.end();) {
    int status = 0;
    pid_t got = ::waitpid(it->first, &status, WNOHANG);
    if (got == 0 || (got < 0 && errno == EINTR)) {
      ++it;
      continue;
    }
    if (got < 0)
      status = 0; // not our child any more: nothing to learn
    statuses[it->second] = status;
    if (failedOrder && exitedWithFailure(status))
      failedOrder->push_back(it->second);
    it = alive.erase(it);
  }
}

void stopChildren(std::map<pid_t, int> &alive, std::map<int, int> &statuses,
                  int graceMs) {
  for (auto &[pid, id] : alive) {
    ::kill(pid, SIGTERM);
    ::kill(pid, SIGCONT); // a stopped child handles SIGTERM once continued
  }
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(graceMs);
  while (!alive.empty() && std::chrono::steady_clock::now() < deadline) {
    reapChildren(alive, statuses);
    if (!alive.empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto &[pid, id] : alive)
    ::kill(pid, SIGKILL);
  for (auto &[pid, id] : alive) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    statuses[id] = status;
  }
  alive.clear();
}

} // namespace piper::runtime
