// Hot spares (--standby), the local launcher's side: the spares' processes
// and promotion pipes, and the choice of the state a generation of ranks
// after a failure starts from.
#include "runtime/launch/supervision/StandbyLauncher.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "proto/PlanShards.h"
#include "runtime/launch/rendezvous/LaunchEnv.h"
#include "runtime/launch/supervision/Children.h"
#include "support/AtomicFile.h"
#include "support/Errno.h"
#include "support/FileIO.h"

namespace piper::runtime {

namespace fs = std::filesystem;

namespace {

/// The ranks of a device class that hold one state: those of
/// tensor-parallel member `member` of `members` (replica r, the r-th rank of
/// the class, is member r mod T), all of the class without tensor
/// parallelism.
struct StateGroup {
  int cls = 0;
  int64_t member = 0, members = 1;
  std::vector<int> ranks;

  /// "device class C", or "device class C's tensor-parallel member M".
  std::string name() const {
    return members < 2 ? fmt::format("device class {}", cls)
                       : fmt::format("device class {}'s tensor-parallel "
                                     "member {}",
                                     cls, member);
  }
};

std::vector<StateGroup> stateGroups(const plan::Manifest &manifest,
                                    const std::vector<int64_t> &tp) {
  std::vector<StateGroup> groups;
  for (int c = 0; c < manifest.classes_size(); ++c) {
    const int64_t t =
        c < static_cast<int>(tp.size()) ? std::max<int64_t>(1, tp[c]) : 1;
    const auto &ranks = manifest.classes(c).ranks();
    for (int64_t m = 0; m < t; ++m) {
      StateGroup g{c, m, t, {}};
      for (int i = 0; i < ranks.size(); ++i)
        if (i % t == m)
          g.ranks.push_back(ranks[i]);
      groups.push_back(std::move(g));
    }
  }
  return groups;
}

std::vector<int64_t> tensorParallelOf(const std::vector<plan::Plan> &plans) {
  std::vector<int64_t> tp;
  for (const plan::Plan &p : plans)
    tp.push_back(plan::tensorParallel(p));
  return tp;
}

} // namespace

int deviceClassOf(const plan::Manifest &manifest, int rank) {
  for (int c = 0; c < manifest.classes_size(); ++c)
    for (int r : manifest.classes(c).ranks())
      if (r == rank)
        return c;
  return -1;
}

std::string shardedStateNote(const std::vector<plan::Plan> &plans) {
  for (const plan::Plan &plan : plans)
    for (const plan::Parameter &param : plan.params())
      if (param.has_sharding() || param.expert_members() > 1)
        return fmt::format("device class {} shards its state over its "
                           "replicas ({}), so no rank holds a copy of "
                           "another's shard",
                           plan.device_class(),
                           param.has_sharding() ? "ZeRO"
                                                : "expert parallelism");
  return std::string();
}

Status checkStandbyState(const RunOptions &options,
                         const plan::Manifest &manifest,
                         const std::vector<plan::Plan> &plans) {
  if (options.standby == 0 || !options.checkpointDir.empty())
    return Status::ok();
  std::string sharded = shardedStateNote(plans);
  if (!sharded.empty())
    return Status::error(
        "--standby needs --checkpoint-dir (with --checkpoint-every) for this "
        "strategy: " +
        sharded + "; only a checkpoint holds a failed rank's state");
  // Under tensor parallelism a member's slices are held by the same member
  // of the other data replicas only.
  for (const StateGroup &g : stateGroups(manifest, tensorParallelOf(plans)))
    if (g.ranks.size() < 2)
      return Status::error(fmt::format(
          "--standby needs --checkpoint-dir (with --checkpoint-every) for "
          "this strategy: {} is rank {} alone{}, so when it fails no "
          "data-parallel replica holds its {}; only a checkpoint does",
          g.name(), g.ranks.empty() ? -1 : g.ranks[0],
          g.members < 2 ? ""
                        : " (tensor parallelism without data "
                          "parallelism)",
          g.members < 2 ? "state" : "slices"));
  return Status::ok();
}

// --- spares ---------------------------------------------------------------------

Spares::~Spares() { release(); }

Status Spares::start(const RunOptions &options, char **argv,
                     const std::vector<std::string> &baseEnv, int failureFd) {
  for (int i = 0; i < options.standby; ++i) {
    int logFd = -1;
    if (!options.logDir.empty()) {
      PIPER_RETURN_IF_ERROR(makeDirectories(options.logDir));
      std::string log = fmt::format("{}/standby-{}.log", options.logDir, i);
      logFd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                     0644);
      if (logFd < 0)
        return Status::error(fmt::format("--log-dir: cannot create '{}': {}",
                                         log, errnoMessage(errno)));
    }
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      if (logFd >= 0)
        ::close(logFd);
      return Status::error(
          fmt::format("cannot create a pipe: {}", errnoMessage(errno)));
    }
    std::vector<std::string> env = baseEnv;
    env.push_back(fmt::format("{}={}", kStandbyVar, i));
    env.push_back(fmt::format("{}={}", kStandbyFdVar, fds[0]));
    env.push_back(fmt::format("PIPER_FAILURE_FD={}", failureFd));
    std::vector<char *> envp;
    for (std::string &s : env)
      envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid = spawnSelf(argv, envp.data(), logFd, {fds[0], failureFd});
    int err = errno;
    ::close(fds[0]);
    if (logFd >= 0)
      ::close(logFd);
    if (pid < 0) {
      ::close(fds[1]);
      return Status::error(fmt::format("cannot start standby {}: {}", i,
                                       errnoMessage(err)));
    }
    parked.push_back(Spare{i, pid, fds[1]});
    ++started;
  }
  return Status::ok();
}

pid_t Spares::promote(
    const std::function<std::vector<std::string>(int index)> &vars,
    int &index) {
  // A spare that died closes its pipe: the write fails (EPIPE) instead of
  // killing the launcher with SIGPIPE.
  struct sigaction ignore, old;
  std::memset(&ignore, 0, sizeof(ignore));
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &old);
  pid_t chosen = -1;
  while (chosen < 0 && !parked.empty()) {
    Spare spare = parked.front();
    parked.erase(parked.begin());
    std::string message;
    for (const std::string &v : vars(spare.index))
      message += v + "\n";
    message += "\n";
    bool sent = writeAll(spare.fd, message.data(), message.size());
    ::close(spare.fd);
    if (sent) {
      chosen = spare.pid;
      index = spare.index;
      ++promoted;
      break;
    }
    fmt::print(stderr, "piper-run: standby {} is gone, skipping it\n",
               spare.index);
    std::map<pid_t, int> one{{spare.pid, spare.index}};
    std::map<int, int> statuses;
    stopChildren(one, statuses, 1000);
  }
  ::sigaction(SIGPIPE, &old, nullptr);
  return chosen;
}

void Spares::reapExited() {
  for (auto it = parked.begin(); it != parked.end();) {
    std::map<pid_t, int> one{{it->pid, it->index}};
    std::map<int, int> statuses;
    reapChildren(one, statuses);
    if (!one.empty()) {
      ++it;
      continue;
    }
    fmt::print(stderr,
               "piper-run: standby {} exited while parked ({}); {} left\n",
               it->index, describeExit(statuses[it->index]),
               parked.size() - 1);
    ::close(it->fd);
    it = parked.erase(it);
  }
}

void Spares::release() {
  if (parked.empty())
    return;
  std::map<pid_t, int> alive;
  for (Spare &s : parked) {
    ::close(s.fd); // end of file: the spare exits 0
    alive[s.pid] = s.index;
  }
  parked.clear();
  std::map<int, int> statuses;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!alive.empty() && std::chrono::steady_clock::now() < deadline) {
    reapChildren(alive, statuses);
    if (!alive.empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stopChildren(alive, statuses, 1000);
}

// --- the state to recover from ------------------------------------------------

Status planRecovery(const plan::Manifest &manifest,
                    const std::vector<int64_t> &tensorParallel,
                    const std::string &handoffDir, const std::set<int> &lost,
                    const std::string &recoveryDir, Recovery &out) {
  out = Recovery();
  // Per state (a class, or a tensor-parallel member of it): step -> the
  // first surviving rank (manifest order) that handed that step off whole.
  const std::vector<StateGroup> groups = stateGroups(manifest, tensorParallel);
  std::vector<std::map<int64_t, int>> held(groups.size());
  for (size_t c = 0; c < groups.size(); ++c) {
    for (int r : groups[c].ranks) {
      if (lost.count(r))
        continue;
      std::error_code ec;
      fs::path dir = fs::path(handoffDir) / fmt::format("rank-{}", r);
      for (const fs::directory_entry &e : fs::directory_iterator(dir, ec)) {
        std::string name = e.path().filename().string();
        if (name.rfind("step-", 0) != 0 ||
            !fs::exists(e.path() / kHandoffCompleteFile, ec))
          continue;
        char *end = nullptr;
        long long step = std::strtoll(name.c_str() + 5, &end, 10);
        if (*end == '\0' && step >= 0)
          held[c].emplace(step, r); // keeps the first rank
      }
    }
  }
  // The newest step that every class (every member) holds.
  int64_t best = -1;
  for (const auto &[step, rank] : held.empty() ? std::map<int64_t, int>()
                                               : held[0]) {
    bool everywhere = std::all_of(held.begin(), held.end(), [&](auto &h) {
      return h.count(step) > 0;
    });
    if (everywhere)
      best = std::max(best, step);
  }
  if (best < 0) {
    for (size_t c = 0; c < groups.size(); ++c)
      if (held[c].empty()) {
        std::string ranks;
        for (int r : groups[c].ranks)
          ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        out.why = fmt::format("no surviving rank of {} (ranks {}) holds its "
                              "state",
                              groups[c].name(), ranks);
        return Status::ok();
      }
    out.why = "the surviving ranks hold no step in common";
    return Status::ok();
  }
  std::error_code ec;
  fs::remove_all(recoveryDir, ec);
  PIPER_RETURN_IF_ERROR(makeDirectories(recoveryDir));
  for (size_t c = 0; c < groups.size(); ++c) {
    int r = held[c].at(best);
    fs::path target = fs::absolute(fs::path(handoffDir) /
                                   fmt::format("rank-{}", r) /
                                   fmt::format("step-{}", best));
    fs::path link = fs::path(recoveryDir) /
                    recoveryStateName(groups[c].cls, groups[c].member);
    fs::create_directory_symlink(target, link, ec);
    if (ec)
      return Status::error(fmt::format("cannot link '{}' to '{}': {}",
                                       link.string(), target.string(),
                                       ec.message()));
    for (int rank : groups[c].ranks)
      out.sourceOf[rank] = r;
  }
  out.fromReplicas = true;
  out.step = best;
  out.dir = recoveryDir;
  return Status::ok();
}

} // namespace piper::runtime
