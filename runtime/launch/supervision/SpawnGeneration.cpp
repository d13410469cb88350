// One generation of piper-run's local ranks (SpawnInternal.h): the failure
// pipe, fork/exec of every rank with its environment and log, supervision
// until all end or one fails, and then naming the rank that failed first
// and stopping the others (SIGTERM, then SIGKILL).
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/launch/checkpoints/CheckpointIO.h"
#include "runtime/launch/checkpoints/Checkpoints.h"
#include "runtime/launch/rendezvous/LaunchEnv.h"
#include "runtime/launch/rendezvous/Rendezvous.h"
#include "runtime/launch/supervision/Children.h"
#include "runtime/launch/supervision/SpawnInternal.h"
#include "runtime/launch/watchdog/Watchdog.h"
#include "support/AtomicFile.h"
#include "support/Errno.h"

namespace piper::runtime::spawn_detail {

namespace {

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

/// One generation's run: its store folder, its ranks' logs and
/// environments, the spawned ranks and how they ended.
class GenerationRun {
public:
  GenerationRun(Launch &launch, const Generation &gen)
      : launch(launch), gen(gen), options(launch.options), n(options.nproc),
        ranks(n, launch.failureRead), logFds(n, -1), logPaths(n) {}

  AttemptEnd run();

private:
  Status openLogs();
  void closeLogs();
  std::vector<std::string> rankVars(int r) const;
  void promoteSpare();
  bool startRanks();
  bool superviseUntilFailure(Clock::time_point &failedAt);
  void waitFor(Clock::time_point until, int pollMs, bool othersOnly,
               int culprit);
  int nameCulprit(Abort &verdict, bool &haveVerdict);
  void reportFailure(int culprit, bool culpritEnded, const Abort &verdict,
                     bool haveVerdict, size_t others);
  void removeLeftovers();
  void removeStore();

  Launch &launch;
  const Generation &gen;
  const RunOptions &options;
  const int n;
  std::string storeDir;
  Supervisor ranks;
  std::vector<int> logFds;
  std::vector<std::string> logPaths;
  /// The recovery note of a promoted spare, told to every rank.
  std::string note;
  AttemptEnd end;
};

void GenerationRun::removeStore() {
  std::error_code ec;
  std::filesystem::remove_all(storeDir, ec);
}

// After a failure or an interruption: a rank killed outright (SIGKILL)
// cannot remove its half-written files, so the launcher does.
void GenerationRun::removeLeftovers() {
  for (const std::string *path : {&options.savePath, &options.saveGradsPath})
    if (!path->empty())
      removeCheckpointLeftovers(*path);
  if (!options.checkpointDir.empty())
    removeIncompleteCheckpoints(options.checkpointDir);
}

// Every rank's log is opened here, before any rank starts, so that a log
// folder that cannot be written is an error rather than a rank whose
// messages vanish. (A promoted spare opens its rank's log itself.)
Status GenerationRun::openLogs() {
  if (options.logDir.empty())
    return Status::ok();
  Status st = makeDirectories(options.logDir);
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
  return st;
}

void GenerationRun::closeLogs() {
  for (int &fd : logFds) {
    if (fd >= 0)
      ::close(fd);
    fd = -1;
  }
}

// The variables that make a process rank `r` of this generation.
std::vector<std::string> GenerationRun::rankVars(int r) const {
  std::vector<std::string> vars =
      rankEnvironment({}, r, n, storeDir, launch.failureWrite);
  vars.push_back(fmt::format("PIPER_ATTEMPT={}", gen.attempt));
  if (gen.failedAtNs >= 0)
    vars.push_back(
        fmt::format("PIPER_RESTART_FAILED_AT_NS={}", gen.failedAtNs));
  if (!launch.standbyRoot.empty() && launch.noHandoff.empty())
    vars.push_back(
        fmt::format("{}={}", kHandoffDirVar, launch.handoffDir(gen.attempt)));
  if (!gen.recoveryDir.empty())
    vars.push_back(fmt::format("{}={}", kRecoveryDirVar, gen.recoveryDir));
  if (!note.empty())
    vars.push_back(fmt::format("{}={}", kRecoveryNoteVar, note));
  return vars;
}

// A spare takes the failed rank's place (before the other ranks start:
// what rank 0 says when training again names it), or that rank starts
// afresh with the others.
void GenerationRun::promoteSpare() {
  int index = -1;
  Clock::time_point failedAt{std::chrono::nanoseconds(gen.failedAtNs)};
  pid_t pid = launch.spares.promote(
      [&](int i) {
        note = fmt::format("rank {} replaced by standby {}", gen.promotedRank,
                           i);
        std::vector<std::string> vars = rankVars(gen.promotedRank);
        if (gen.resume)
          vars.push_back(fmt::format("{}=1", kPromoteResumeVar));
        return vars;
      },
      index);
  if (pid >= 0) {
    ranks.alive[pid] = gen.promotedRank;
    fmt::print(stderr,
               "piper-run: rank {} replaced by standby {}, {} ({:.2f} "
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

// Spawns every rank a spare did not take; false (printed, and the ones
// started stopped) when one cannot be started.
bool GenerationRun::startRanks() {
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
    pid_t pid = spawnSelf(gen.argv, envPtrs[r].data(), logFds[r],
                          {launch.failureWrite});
    if (pid < 0) {
      fmt::print(stderr, "piper-run: cannot start rank {}: {}\n", r,
                 errnoMessage(errno));
      stopChildren(ranks.alive, ranks.statuses, kStopGraceMs);
      return false;
    }
    ranks.alive[pid] = r;
  }
  return true;
}

// Waits until every rank has ended or one has failed (then `failedAt`);
// false when a stop signal came first.
bool GenerationRun::superviseUntilFailure(Clock::time_point &failedAt) {
  while (!ranks.alive.empty()) {
    ranks.poll(50);
    if (stopSignal)
      return false;
    ranks.drainPipe();
    ranks.reapExited();
    launch.spares.reapExited();
    if (ranks.anyFailed()) {
      failedAt = Clock::now();
      break;
    }
  }
  return true;
}

// Reads the failure pipe and reaps until `until`, or until no rank (with
// `othersOnly`, no rank but `culprit`) is alive.
void GenerationRun::waitFor(Clock::time_point until, int pollMs,
                            bool othersOnly, int culprit) {
  auto anyAlive = [&] {
    for (auto &[pid, r] : ranks.alive)
      if (!othersOnly || r != culprit)
        return true;
    return false;
  };
  while (anyAlive() && Clock::now() < until) {
    ranks.poll(pollMs);
    ranks.drainPipe();
    ranks.reapExited();
  }
}

// The watchdogs' verdict, if one was reached (a silent or stuck rank);
// otherwise the launcher's own goes into the store, so that every rank
// prints its report naming the same culprit and exits by itself.
int GenerationRun::nameCulprit(Abort &verdict, bool &haveVerdict) {
  std::unique_ptr<WatchStore> watch = fileWatchStore(storeDir);
  std::string verdictText;
  bool present = false;
  haveVerdict = watch->get(kAbortKey, verdictText, present) && present &&
                decodeAbort(verdictText, verdict);
  int culprit = ranks.culprit(haveVerdict ? &verdict : nullptr);
  bool culpritEnded = ranks.statuses.count(culprit) > 0;
  if (!haveVerdict || verdict.culprit != culprit) {
    bool wrote = false;
    Abort mine{culprit, culpritEnded ? describeExit(ranks.statuses[culprit])
                                     : std::string("reported a failure")};
    if (watch->putOnce(kAbortKey, encodeAbort(mine), wrote) && wrote)
      verdict = mine, haveVerdict = true;
  }
  return culprit;
}

// Says which rank failed and how, the end of its log, and what became of
// the others; records in `end` the ranks whose state is lost.
void GenerationRun::reportFailure(int culprit, bool culpritEnded,
                                  const Abort &verdict, bool haveVerdict,
                                  size_t others) {
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
}

AttemptEnd GenerationRun::run() {
  end.exitCode = 1;
  Status st = makeStoreDir(storeDir);
  if (!st) {
    fmt::print(stderr, "piper-run: {}\n", st.message());
    return end;
  }
  st = openLogs();
  if (!st) {
    fmt::print(stderr, "piper-run: {}\n", st.message());
    closeLogs();
    removeStore();
    return end;
  }
  // Lines left on the failure pipe by the generation before are old news.
  ranks.drainPipe();
  ranks.reported.clear();

  std::fflush(stdout);
  std::fflush(stderr);
  if (gen.promotedRank >= 0)
    promoteSpare();
  bool started = startRanks();
  closeLogs();
  if (!started) {
    removeStore();
    return end;
  }

  Clock::time_point failedAt;
  if (!superviseUntilFailure(failedAt)) {
    fmt::print(stderr,
               "piper-run: interrupted (signal {}), stopping {} ranks\n",
               static_cast<int>(stopSignal), ranks.alive.size());
    stopChildren(ranks.alive, ranks.statuses, kStopGraceMs);
    removeLeftovers();
    removeStore();
    end.exitCode = 128 + stopSignal;
    return end;
  }
  if (!ranks.anyFailed()) {
    removeStore();
    end.exitCode = 0;
    return end;
  }
  end.rankFailed = true;
  end.failedAt = failedAt;

  // Let a failure's direct consequences surface before naming a culprit: a
  // rank killed by a signal (a crash) writes no line, and its peers' lines
  // may come first.
  waitFor(Clock::now() + kSettle, 20, false, -1);
  Abort verdict;
  bool haveVerdict = false;
  int culprit = nameCulprit(verdict, haveVerdict);
  // With --standby the others also hand their state off before they exit.
  waitFor(Clock::now() + kReportGrace +
              (launch.standbyRoot.empty()
                   ? std::chrono::seconds(0)
                   : std::chrono::seconds(options.timeoutS)),
          20, true, culprit);
  bool culpritEnded = ranks.statuses.count(culprit) > 0;
  size_t others = ranks.alive.size();
  stopChildren(ranks.alive, ranks.statuses, kStopGraceMs);
  ranks.drainPipe();

  reportFailure(culprit, culpritEnded, verdict, haveVerdict, others);
  removeLeftovers();
  removeStore();
  return end;
}

} // namespace

void catchStopSignals() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);
}

AttemptEnd launchGeneration(Launch &launch, const Generation &gen) {
  return GenerationRun(launch, gen).run();
}

} // namespace piper::runtime::spawn_detail
