// Spawning and supervising local ranks: fork/exec, the failure pipe, and
// stopping every rank (SIGTERM, then SIGKILL) when one fails; then, when a
// spare (--standby) or a restart (--max-restarts) is left, launching the
// next generation of ranks from the state of a surviving replica or the
// newest checkpoint.
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
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/launch/CheckpointIO.h"
#include "runtime/launch/Checkpoints.h"
#include "runtime/launch/Children.h"
#include "runtime/launch/Rendezvous.h"
#include "runtime/launch/Standby.h"
#include "runtime/launch/StandbyLauncher.h"
#include "runtime/launch/StrategyFiles.h"
#include "runtime/launch/Watchdog.h"
#include "runtime/support/AtomicFile.h"
#include "runtime/support/Errno.h"

namespace piper::runtime {

namespace {

using Clock = std::chrono::steady_clock;

/// How long stopped ranks get between SIGTERM and SIGKILL.
constexpr int kStopGraceMs = 5000;

/// How long the other ranks get, once a verdict is in the store, to print
/// their hang reports and exit by themselves (their watchdogs poll it four
/// times a second).
constexpr auto kReportGrace = std::chrono::seconds(3);

/// How long a failure's direct consequences get to surface before the
/// launcher names a culprit.
constexpr auto kSettle = std::chrono::milliseconds(300);

volatile sig_atomic_t stopSignal = 0;

void onStopSignal(int sig) { stopSignal = sig; }

long long nanosOf(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             t.time_since_epoch())
      .count();
}

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// The last `lines` lines of the file at `path`, for failure reports.
std::string tailOf(const std::string &path, size_t lines) {
  // A log that is not a regular file (a link to a device) may never end.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return "";
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

/// The spawned ranks of one generation and what is known of their ends.
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
  void reapExited() { reapChildren(alive, statuses, &reapOrder); }

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
  /// (recovery-<A>/class-<C>).
  Spares spares;
  std::string standbyRoot;
  /// Why the ranks hand no state off (a ZeRO-sharded class: no replica
  /// holds a copy of another's shard); empty when they do.
  std::string noHandoff;

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

/// Launches generation `gen` of the ranks and supervises it to the end.
AttemptEnd launchOnce(Launch &launch, const Generation &gen) {
  const RunOptions &options = launch.options;
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
  // messages vanish. (A promoted spare opens its rank's log itself.)
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
      if (r == gen.promotedRank)
        continue;
      // A later generation adds to the logs of the ones before it.
      logFds[r] = ::open(logPaths[r].c_str(),
                         O_WRONLY | O_CREAT | O_CLOEXEC |
                             (gen.attempt == 0 ? O_TRUNC : O_APPEND),
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

  // Lines left on the failure pipe by the generation before are old news.
  Supervisor ranks(n, launch.failureRead);
  ranks.drainPipe();
  ranks.reported.clear();

  // The variables that make a process rank `r` of this generation.
  std::string note;
  auto rankVars = [&](int r) {
    std::vector<std::string> vars =
        rankEnvironment({}, r, n, storeDir, launch.failureWrite);
    vars.push_back(fmt::format("PIPER_ATTEMPT={}", gen.attempt));
    if (gen.failedAtNs >= 0)
      vars.push_back(
          fmt::format("PIPER_RESTART_FAILED_AT_NS={}", gen.failedAtNs));
    if (!launch.standbyRoot.empty() && launch.noHandoff.empty())
      vars.push_back(fmt::format("{}={}", kHandoffDirVar,
                                 launch.handoffDir(gen.attempt)));
    if (!gen.recoveryDir.empty())
      vars.push_back(fmt::format("{}={}", kRecoveryDirVar, gen.recoveryDir));
    if (!note.empty())
      vars.push_back(fmt::format("{}={}", kRecoveryNoteVar, note));
    return vars;
  };

  std::fflush(stdout);
  std::fflush(stderr);
  // The spare first: what rank 0 says when training again names it.
  if (gen.promotedRank >= 0) {
    int index = -1;
    Clock::time_point failedAt{std::chrono::nanoseconds(gen.failedAtNs)};
    pid_t pid = launch.spares.promote(
        [&](int i) {
          note = fmt::format("rank {} replaced by standby {}",
                             gen.promotedRank, i);
          std::vector<std::string> vars = rankVars(gen.promotedRank);
          if (gen.resume)
            vars.push_back(fmt::format("{}=1", kPromoteResumeVar));
          return vars;
        },
        index);
    if (pid >= 0) {
      ranks.alive[pid] = gen.promotedRank;
      fmt::print(stderr, "piper-run: rank {} replaced by standby {}, {} ({:.2f} "
                         "s after the failure)\n",
                 gen.promotedRank, index, gen.recoveryText,
                 secondsSince(failedAt));
    } else {
      note.clear();
      fmt::print(stderr,
                 "piper-run: no standby could take rank {}'s place; starting "
                 "it afresh, {}\n",
                 gen.promotedRank, gen.recoveryText);
    }
  }
  std::vector<std::vector<std::string>> envs(n);
  std::vector<std::vector<char *>> envPtrs(n);
  for (int r = 0; r < n; ++r) {
    envs[r] = launch.baseEnv;
    for (std::string &v : rankVars(r))
      envs[r].push_back(std::move(v));
    for (std::string &s : envs[r])
      envPtrs[r].push_back(s.data());
    envPtrs[r].push_back(nullptr);
  }
  for (int r = 0; r < n; ++r) {
    if (std::any_of(ranks.alive.begin(), ranks.alive.end(),
                    [&](auto &entry) { return entry.second == r; }))
      continue; // the promoted spare
    pid_t pid =
        spawnSelf(gen.argv, envPtrs[r].data(), logFds[r], {launch.failureWrite});
    if (pid < 0) {
      fmt::print(stderr, "piper-run: cannot start rank {}: {}\n", r,
                 errnoMessage(errno));
      stopChildren(ranks.alive, ranks.statuses, kStopGraceMs);
      closeLogs();
      cleanup();
      return end;
    }
    ranks.alive[pid] = r;
  }
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
    launch.spares.reapExited();
    if (ranks.anyFailed()) {
      failedAt = Clock::now();
      break;
    }
  }
  if (interrupted) {
    fmt::print(stderr,
               "piper-run: interrupted (signal {}), stopping {} ranks\n",
               static_cast<int>(stopSignal), ranks.alive.size());
    stopChildren(ranks.alive, ranks.statuses, kStopGraceMs);
    removeLeftovers();
    cleanup();
    end.exitCode = 128 + stopSignal;
    return end;
  }
  if (!ranks.anyFailed()) {
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
  // With --standby the others also hand their state off before they exit.
  auto grace = Clock::now() + kReportGrace +
               (launch.standbyRoot.empty()
                    ? std::chrono::seconds(0)
                    : std::chrono::seconds(options.timeoutS));
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
  stopChildren(ranks.alive, ranks.statuses, kStopGraceMs);
  ranks.drainPipe();

  end.culprit = culprit;
  end.lost.insert(culprit);
  end.guessed = haveVerdict && verdict.guess && verdict.culprit == culprit;
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
        WEXITSTATUS(ranks.statuses[r]) == kExitPeerFailed) {
      peerFailed.push_back(r);
    } else {
      end.lost.insert(r);
      fmt::print(stderr, "piper-run: rank {} also failed ({})\n", r,
                 describeExit(ranks.statuses[r]));
    }
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

int launchLocalRanks(const RunOptions &options,
                     const plan::Manifest &manifest, char **argv) {
  Launch launch(options);
  // Ranks write "R\n" to this pipe just before they exit on an error. A
  // rank that dies makes its peers fail within microseconds, often before
  // the dying process is reapable, so the first line, not the first exit,
  // names the rank that failed first. One pipe serves every generation.
  int failurePipe[2];
  if (::pipe2(failurePipe, O_CLOEXEC) != 0) {
    fmt::print(stderr, "piper-run: cannot create a pipe: {}\n",
               errnoMessage(errno));
    return 1;
  }
  ::fcntl(failurePipe[0], F_SETFL, O_NONBLOCK);
  launch.failureRead = failurePipe[0];
  launch.failureWrite = failurePipe[1];
  auto closePipe = [&] {
    ::close(failurePipe[0]);
    ::close(failurePipe[1]);
  };
  // Everything a child needs is built before fork: after it, the child may
  // only make async-signal-safe calls (the parent may have BLAS threads).
  launch.baseEnv = inheritedEnvironment(options.nproc);

  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);

  if (options.standby > 0) {
    std::vector<plan::Plan> plans;
    Status st = loadPlans(options, manifest, plans);
    launch.noHandoff = shardedStateNote(plans);
    if (st)
      st = makeStoreDir(launch.standbyRoot);
    if (st)
      st = launch.spares.start(options, argv, launch.baseEnv,
                               launch.failureWrite);
    if (!st) {
      fmt::print(stderr, "piper-run: --standby: {}\n", st.message());
      launch.spares.release();
      closePipe();
      return 1;
    }
  }
  auto finish = [&](int code) {
    launch.spares.release();
    if (!launch.standbyRoot.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(launch.standbyRoot, ec);
    }
    closePipe();
    return code;
  };

  // Restarts from a checkpoint: the same command line plus --resume
  // (--steps is then the total, so a restarted run ends where the first
  // would have).
  std::vector<char *> resumeArgv;
  for (char **a = argv; *a; ++a)
    resumeArgv.push_back(*a);
  static char resumeFlag[] = "--resume";
  if (!options.resume)
    resumeArgv.push_back(resumeFlag);
  resumeArgv.push_back(nullptr);

  Generation gen;
  gen.argv = argv;
  int restarts = 0;
  while (true) {
    AttemptEnd end = launchOnce(launch, gen);
    if (!end.rankFailed)
      return finish(end.exitCode);
    launch.spares.reapExited();
    if (end.guessed && launch.spares.left() > 0)
      fmt::print(stderr,
                 "piper-run: --standby: no spare replaces rank {}: the "
                 "watchdog could not tell which rank failed\n",
                 end.culprit);
    const bool spare = launch.spares.left() > 0 && !end.guessed;
    if (!spare && restarts >= options.maxRestarts) {
      if (options.standby > 0 && launch.spares.left() == 0)
        fmt::print(stderr, "piper-run: no standby left ({} of {} used)\n",
                   launch.spares.used(), launch.spares.total());
      if (options.maxRestarts > 0)
        fmt::print(stderr, "piper-run: no restart left ({} of {} used)\n",
                   restarts, options.maxRestarts);
      return finish(end.exitCode);
    }

    Generation next;
    next.attempt = gen.attempt + 1;
    next.failedAtNs = nanosOf(end.failedAt);
    next.argv = resumeArgv.data();
    next.resume = true;
    std::string source = fmt::format(
        "every rank resuming from the newest checkpoint of '{}'",
        options.checkpointDir);
    if (options.standby > 0) {
      // The states the survivors handed off; those of the generation
      // before are no longer needed.
      std::error_code ec;
      if (gen.attempt > 0) {
        std::filesystem::remove_all(launch.handoffDir(gen.attempt - 1), ec);
        std::filesystem::remove_all(
            fmt::format("{}/recovery-{}", launch.standbyRoot, gen.attempt),
            ec);
      }
      Recovery recovery;
      recovery.why = launch.noHandoff;
      Status st = Status::ok();
      if (launch.noHandoff.empty())
        st = planRecovery(
            manifest, launch.handoffDir(gen.attempt), end.lost,
            fmt::format("{}/recovery-{}", launch.standbyRoot, next.attempt),
            recovery);
      if (!st) {
        fmt::print(stderr, "piper-run: --standby: {}\n", st.message());
        return finish(end.exitCode);
      }
      const int cls = deviceClassOf(manifest, end.culprit);
      if (recovery.fromReplicas) {
        next.argv = argv;
        next.resume = false;
        next.recoveryDir = recovery.dir;
        int from = recovery.sourceOf.count(cls) ? recovery.sourceOf[cls] : -1;
        source = fmt::format("state of step {} from its replica rank {}",
                             recovery.step, from);
      } else if (options.checkpointDir.empty()) {
        fmt::print(stderr,
                   "piper-run: cannot continue after rank {} failed: {}, and "
                   "there is no --checkpoint-dir to resume from\n",
                   end.culprit, recovery.why);
        return finish(end.exitCode);
      } else {
        source += fmt::format(" ({})", recovery.why);
      }
    }
    next.recoveryText = source;
    if (spare) {
      next.promotedRank = end.culprit;
    } else {
      ++restarts;
      if (options.standby > 0)
        fmt::print(stderr,
                   "piper-run: restart {} of {}: relaunching {} ranks, {} "
                   "({:.2f} s after the failure)\n",
                   restarts, options.maxRestarts, options.nproc, source,
                   secondsSince(end.failedAt));
      else
        fmt::print(stderr,
                   "piper-run: restart {} of {}: relaunching {} ranks from "
                   "the newest checkpoint of '{}' ({:.2f} s after the "
                   "failure)\n",
                   restarts, options.maxRestarts, options.nproc,
                   options.checkpointDir, secondsSince(end.failedAt));
    }
    gen = next;
  }
}

} // namespace piper::runtime
