// Spawning and supervising local ranks: fork/exec, the failure pipe, and
// stopping every rank (SIGTERM, then SIGKILL) when one fails, and
// relaunching them all from the newest checkpoint (--max-restarts).
#include "runtime/launch/Spawn.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/data/AtomicFile.h"
#include "runtime/launch/CheckpointIO.h"
#include "runtime/launch/Checkpoints.h"
#include "runtime/launch/Rendezvous.h"
#include "runtime/launch/Watchdog.h"

namespace piper::runtime {

namespace {

using Clock = std::chrono::steady_clock;

/// How long stopped ranks get between SIGTERM and SIGKILL.
constexpr auto kStopGrace = std::chrono::seconds(5);

/// How long the other ranks get, once a verdict is in the store, to print
/// their hang reports and exit by themselves (their watchdogs poll it four
/// times a second).
constexpr auto kReportGrace = std::chrono::seconds(3);

/// How long a failure's direct consequences get to surface before the
/// launcher names a culprit.
constexpr auto kSettle = std::chrono::milliseconds(300);

volatile sig_atomic_t stopSignal = 0;

void onStopSignal(int sig) { stopSignal = sig; }

std::string describeExit(int status) {
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

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status); }

/// The last `lines` lines of the file at `path`, for failure reports.
std::string tailOf(const std::string &path, size_t lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (tail.size() > lines)
      tail.pop_front();
  }
  std::string out;
  for (const std::string &l : tail)
    out += "  | " + l + "\n";
  return out;
}

/// Sends SIGTERM to every live child, then SIGKILL to those still alive
/// after the grace period, and reaps them all into `statuses` (by rank).
void stopAll(std::map<pid_t, int> &alive, std::map<int, int> &statuses) {
  for (auto &[pid, rank] : alive) {
    ::kill(pid, SIGTERM);
    ::kill(pid, SIGCONT); // a stopped rank handles SIGTERM once continued
  }
  auto reap = [&](pid_t pid, int status) {
    auto it = alive.find(pid);
    if (it == alive.end())
      return;
    statuses[it->second] = status;
    alive.erase(it);
  };
  auto deadline = Clock::now() + kStopGrace;
  while (!alive.empty() && Clock::now() < deadline) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      reap(pid, status);
      continue;
    }
    if (pid < 0 && errno != EINTR)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto &[pid, rank] : alive)
    ::kill(pid, SIGKILL);
  while (!alive.empty()) {
    pid_t pid = alive.begin()->first;
    int status = 0;
    pid_t got = ::waitpid(pid, &status, 0);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      status = 0;
    reap(pid, status);
  }
}

/// The spawned ranks of one run and what is known of their ends.
class Supervisor {
public:
  Supervisor(int nproc, int failureReadFd)
      : nproc(nproc), failureReadFd(failureReadFd) {}

  /// pid -> rank of every rank not reaped yet.
  std::map<pid_t, int> alive;
  /// Exit status by rank, once reaped.
  std::map<int, int> statuses;
  /// Ranks in the order they reported a failure on the pipe.
  std::vector<int> reported;
  /// Failed ranks in the order they were reaped.
  std::vector<int> reapOrder;

  bool anyFailed() const { return !reported.empty() || !reapOrder.empty(); }

  /// Waits up to `ms` for a line on the failure pipe (EINTR just means:
  /// look again).
  void poll(int ms) {
    struct pollfd pfd = {failureReadFd, POLLIN, 0};
    ::poll(&pfd, 1, ms);
  }

  /// Reads the "R\n" lines ranks wrote to the failure pipe.
  void drainPipe() {
    char buf[256];
    ssize_t got;
    while ((got = ::read(failureReadFd, buf, sizeof(buf))) > 0) {
      pending.append(buf, static_cast<size_t>(got));
      size_t eol;
      while ((eol = pending.find('\n')) != std::string::npos) {
        int r = std::atoi(pending.substr(0, eol).c_str());
        pending.erase(0, eol + 1);
        if (r >= 0 && r < nproc &&
            std::find(reported.begin(), reported.end(), r) == reported.end())
          reported.push_back(r);
      }
    }
  }

  /// Reaps every rank that has exited, without blocking.
  void reapExited() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = alive.find(pid);
      if (it == alive.end())
        continue;
      statuses[it->second] = status;
      if (failed(status))
        reapOrder.push_back(it->second);
      alive.erase(it);
    }
  }

  /// The rank that failed first: one killed by a signal (a crash writes no
  /// line), before the watchdogs' verdict `abort` (when it names a rank),
  /// before the first to report, before the first reaped.
  int culprit(const Abort *abort) {
    for (int r : reapOrder)
      if (WIFSIGNALED(statuses[r]))
        return r;
    if (abort && abort->culprit >= 0 && abort->culprit < nproc)
      return abort->culprit;
    return !reported.empty() ? reported.front() : reapOrder.front();
  }

private:
  int nproc;
  int failureReadFd;
  std::string pending;
};

/// How one launch of the ranks ended.
struct AttemptEnd {
  int exitCode = 0;
  /// A rank failed (not an interruption, not a launcher error): a restart
  /// may follow.
  bool rankFailed = false;
  /// When the launcher first saw the failure (steady clock).
  Clock::time_point failedAt;
};

/// Launches the ranks once (`attempt`, from 0; `failedAtNs` is when the
/// previous attempt failed, -1 for the first) and supervises them to the end.
AttemptEnd launchOnce(const RunOptions &options, char **argv, int attempt,
                      long long failedAtNs) {
  AttemptEnd end;
  end.exitCode = 1;
  const int n = options.nproc;
  std::string storeDir;
  Status st = makeStoreDir(storeDir);
  if (!st) {
    fmt::print(stderr, "piper-run: {}\n", st.message());
    return end;
  }
  auto cleanup = [&] {
    std::error_code ec;
    std::filesystem::remove_all(storeDir, ec);
  };
  // After a failure or an interruption: a rank killed outright (SIGKILL)
  // cannot remove its half-written files, so the launcher does.
  auto removeLeftovers = [&] {
    for (const std::string *path : {&options.savePath, &options.saveGradsPath})
      if (!path->empty())
        removeCheckpointLeftovers(*path);
    if (!options.checkpointDir.empty())
      removeIncompleteCheckpoints(options.checkpointDir);
  };

  // Every rank's log is opened here, before any rank starts, so that a log
  // folder that cannot be written is an error rather than a rank whose
  // messages vanish.
  std::vector<int> logFds(n, -1);
  auto closeLogs = [&] {
    for (int &fd : logFds) {
      if (fd >= 0)
        ::close(fd);
      fd = -1;
    }
  };
  std::vector<std::string> logPaths(n);
  if (!options.logDir.empty()) {
    st = makeDirectories(options.logDir);
    for (int r = 0; st && r < n; ++r) {
      logPaths[r] = fmt::format("{}/rank-{}.log", options.logDir, r);
      // A restart adds to the logs of the attempts before it.
      logFds[r] = ::open(logPaths[r].c_str(),
                         O_WRONLY | O_CREAT | O_CLOEXEC |
                             (attempt == 0 ? O_TRUNC : O_APPEND),
                         0644);
      if (logFds[r] < 0)
        st = Status::error(fmt::format("--log-dir: cannot create '{}': {}",
                                       logPaths[r], errnoMessage(errno)));
    }
    if (!st) {
      fmt::print(stderr, "piper-run: {}\n", st.message());
      closeLogs();
      cleanup();
      return end;
    }
  }

  // Ranks write "R\n" to this pipe just before they exit on an error. A
  // rank that dies makes its peers fail within microseconds, often before
  // the dying process is reapable, so the first line, not the first exit,
  // names the rank that failed first.
  int failurePipe[2];
  if (::pipe2(failurePipe, O_CLOEXEC) != 0) {
    fmt::print(stderr, "piper-run: cannot create a pipe: {}\n",
               errnoMessage(errno));
    cleanup();
    return end;
  }
  ::fcntl(failurePipe[0], F_SETFL, O_NONBLOCK);

  // Everything a child needs is built before fork: after it, the child may
  // only make async-signal-safe calls (the parent may have BLAS threads).
  std::vector<std::string> baseEnv = inheritedEnvironment(n);
  std::vector<std::vector<std::string>> envs(n);
  std::vector<std::vector<char *>> envPtrs(n);
  for (int r = 0; r < n; ++r) {
    envs[r] = rankEnvironment(baseEnv, r, n, storeDir, failurePipe[1]);
    envs[r].push_back(fmt::format("PIPER_ATTEMPT={}", attempt));
    if (failedAtNs >= 0)
      envs[r].push_back(
          fmt::format("PIPER_RESTART_FAILED_AT_NS={}", failedAtNs));
    for (std::string &s : envs[r])
      envPtrs[r].push_back(s.data());
    envPtrs[r].push_back(nullptr);
  }

  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);

  std::fflush(stdout);
  std::fflush(stderr);
  pid_t parent = ::getpid();
  Supervisor ranks(n, failurePipe[0]);
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) {
      fmt::print(stderr, "piper-run: cannot start rank {}: {}\n", r,
                 errnoMessage(errno));
      stopAll(ranks.alive, ranks.statuses);
      closeLogs();
      cleanup();
      return end;
    }
    if (pid == 0) {
      // Die with the launcher, so that no rank outlives a killed run.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent)
        ::_exit(1);
      // The write end must survive exec; dup2 onto itself would not clear
      // FD_CLOEXEC, so clear it by hand.
      ::fcntl(failurePipe[1], F_SETFD, 0);
      if (logFds[r] >= 0)
        ::dup2(logFds[r], STDERR_FILENO);
      ::execve("/proc/self/exe", argv, envPtrs[r].data());
      const char msg[] = "piper-run: cannot exec /proc/self/exe\n";
      ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
      (void)ignored;
      ::_exit(127);
    }
    ranks.alive[pid] = r;
  }
  ::close(failurePipe[1]);
  closeLogs();

  bool interrupted = false;
  Clock::time_point failedAt;
  while (!ranks.alive.empty()) {
    ranks.poll(50);
    if (stopSignal) {
      interrupted = true;
      break;
    }
    ranks.drainPipe();
    ranks.reapExited();
    if (ranks.anyFailed()) {
      failedAt = Clock::now();
      break;
    }
  }
  if (interrupted) {
    fmt::print(stderr,
               "piper-run: interrupted (signal {}), stopping {} ranks\n",
               static_cast<int>(stopSignal), ranks.alive.size());
    stopAll(ranks.alive, ranks.statuses);
    ::close(failurePipe[0]);
    removeLeftovers();
    cleanup();
    end.exitCode = 128 + stopSignal;
    return end;
  }
  if (!ranks.anyFailed()) {
    ::close(failurePipe[0]);
    cleanup();
    end.exitCode = 0;
    return end;
  }
  end.rankFailed = true;
  end.failedAt = failedAt;

  // Let a failure's direct consequences surface before naming a culprit: a
  // rank killed by a signal (a crash) writes no line, and its peers' lines
  // may come first.
  auto settle = Clock::now() + kSettle;
  while (!ranks.alive.empty() && Clock::now() < settle) {
    ranks.poll(20);
    ranks.drainPipe();
    ranks.reapExited();
  }
  // The watchdogs' verdict, if one was reached (a silent or stuck rank);
  // otherwise the launcher's own goes into the store, so that every rank
  // prints its report naming the same culprit and exits by itself.
  std::unique_ptr<WatchStore> watch = fileWatchStore(storeDir);
  Abort verdict;
  std::string verdictText;
  bool present = false;
  bool haveVerdict = watch->get(kAbortKey, verdictText, present) && present &&
                     decodeAbort(verdictText, verdict);
  int culprit = ranks.culprit(haveVerdict ? &verdict : nullptr);
  bool culpritEnded = ranks.statuses.count(culprit) > 0;
  if (!haveVerdict || verdict.culprit != culprit) {
    bool wrote = false;
    Abort mine{culprit, culpritEnded
                            ? describeExit(ranks.statuses[culprit])
                            : std::string("reported a failure")};
    if (watch->putOnce(kAbortKey, encodeAbort(mine), wrote) && wrote)
      verdict = mine, haveVerdict = true;
  }
  auto grace = Clock::now() + kReportGrace;
  auto othersAlive = [&] {
    for (auto &[pid, r] : ranks.alive)
      if (r != culprit)
        return true;
    return false;
  };
  while (othersAlive() && Clock::now() < grace) {
    ranks.poll(20);
    ranks.drainPipe();
    ranks.reapExited();
  }
  culpritEnded = ranks.statuses.count(culprit) > 0;
  size_t others = ranks.alive.size();
  stopAll(ranks.alive, ranks.statuses);
  ranks.drainPipe();
  ::close(failurePipe[0]);

  if (culpritEnded)
    fmt::print(stderr, "piper-run: rank {} failed ({})\n", culprit,
               describeExit(ranks.statuses[culprit]));
  else
    fmt::print(stderr, "piper-run: rank {} failed (watchdog: {})\n", culprit,
               haveVerdict && verdict.culprit == culprit
                   ? verdict.reason
                   : std::string("reported a failure"));
  if (!logPaths[culprit].empty())
    fmt::print(stderr, "piper-run: end of {}:\n{}", logPaths[culprit],
               tailOf(logPaths[culprit], 20));
  std::vector<int> peerFailed;
  for (int r : ranks.reapOrder) {
    if (r == culprit)
      continue;
    if (WIFEXITED(ranks.statuses[r]) &&
        WEXITSTATUS(ranks.statuses[r]) == kExitPeerFailed)
      peerFailed.push_back(r);
    else
      fmt::print(stderr, "piper-run: rank {} also failed ({})\n", r,
                 describeExit(ranks.statuses[r]));
  }
  if (!peerFailed.empty()) {
    std::string list;
    for (int r : peerFailed)
      list += (list.empty() ? "" : ", ") + std::to_string(r);
    fmt::print(stderr,
               "piper-run: rank{} {} stopped because rank {} failed (exit "
               "code {})\n",
               peerFailed.size() == 1 ? "" : "s", list, culprit,
               kExitPeerFailed);
  }
  if (others > 0)
    fmt::print(stderr, "piper-run: stopped the other {} rank{}\n", others,
               others == 1 ? "" : "s");
  removeLeftovers();
  cleanup();
  return end;
}

} // namespace

int launchLocalRanks(const RunOptions &options, char **argv) {
  // Restarts resume: the same command line plus --resume (--steps is then
  // the total, so a restarted run ends where the first would have).
  std::vector<char *> resumeArgv;
  for (char **a = argv; *a; ++a)
    resumeArgv.push_back(*a);
  static char resumeFlag[] = "--resume";
  if (!options.resume)
    resumeArgv.push_back(resumeFlag);
  resumeArgv.push_back(nullptr);
  long long failedAtNs = -1;
  for (int attempt = 0;; ++attempt) {
    AttemptEnd end = launchOnce(
        options, attempt == 0 ? argv : resumeArgv.data(), attempt, failedAtNs);
    if (!end.rankFailed || options.maxRestarts == 0)
      return end.exitCode;
    if (attempt >= options.maxRestarts) {
      fmt::print(stderr, "piper-run: no restart left ({} of {} used)\n",
                 attempt, options.maxRestarts);
      return end.exitCode;
    }
    failedAtNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     end.failedAt.time_since_epoch())
                     .count();
    double stopped =
        std::chrono::duration<double>(Clock::now() - end.failedAt).count();
    fmt::print(stderr,
               "piper-run: restart {} of {}: relaunching {} ranks from the "
               "newest checkpoint of '{}' ({:.2f} s after the failure)\n",
               attempt + 1, options.maxRestarts, options.nproc,
               options.checkpointDir, stopped);
  }
}

} // namespace piper::runtime
