// piper-run's launcher (spawn, supervise, stop everything on the first
// failure) and its per-rank main (load, validate, connect, step, report).
#include "runtime/exec/Launcher.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "proto/PlanFile.h"
#include "runtime/checkpoint/Safetensors.h"
#include "runtime/comm/Communicator.h"
#include "runtime/data/AtomicFile.h"
#include "runtime/exec/Data.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/Validate.h"
#include "runtime/kernels/Kernels.h"

extern char **environ;

namespace piper::runtime {

namespace {

using Clock = std::chrono::steady_clock;

/// How long stopped ranks get between SIGTERM and SIGKILL.
constexpr auto kStopGrace = std::chrono::seconds(5);

volatile sig_atomic_t stopSignal = 0;

/// The launcher's failure pipe (PIPER_FAILURE_FD) and this rank's line for
/// it; unset when the rank was not started by piper-run's launcher.
int failureFd = -1;
char failureLine[24];
size_t failureLineSize = 0;

/// Tells the launcher that this rank is about to exit on an error.
void reportFailure() {
  if (failureFd < 0)
    return;
  ssize_t ignored = ::write(failureFd, failureLine, failureLineSize);
  (void)ignored;
  failureFd = -1;
}
void onStopSignal(int sig) { stopSignal = sig; }

std::string joinPath(const std::string &dir, const std::string &file) {
  if (!file.empty() && file[0] == '/')
    return file;
  return dir + "/" + file;
}

std::string lowerErrno(int err) {
  std::string s = std::strerror(err);
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z')
    s[0] = static_cast<char>(s[0] - 'A' + 'a');
  return s;
}

/// Reads an integer environment variable; false when unset or malformed.
bool envInt(const char *name, long long &value, std::string &error) {
  const char *text = std::getenv(name);
  if (!text || !*text)
    return false;
  char *end = nullptr;
  errno = 0;
  value = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0') {
    error = std::string(name) + "='" + text + "' is not an integer";
    return false;
  }
  return true;
}

Status mkdirs(const std::string &dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return Status::error("cannot create directory '" + dir +
                         "': " + ec.message());
  return Status::ok();
}

/// Reads the manifest of `outDir` and checks it against the command line.
Status loadManifest(const RunOptions &options, plan::Manifest &manifest) {
  std::string err = plan::readManifest(
      joinPath(options.outDir, plan::kManifestFileName), manifest);
  if (!err.empty())
    return Status::error(err);
  if (options.backend != "cpu")
    return Status::error("backend '" + options.backend +
                         "' is not available in this build (available: cpu)");
  return Status::ok();
}

/// Reads the plan file of manifest class `index`.
Status loadPlan(const RunOptions &options, const plan::Manifest &manifest,
                int index, plan::Plan &plan) {
  std::string err = plan::readPlanFile(
      joinPath(options.outDir, manifest.classes(index).plan_file()), plan);
  return err.empty() ? Status::ok() : Status::error(err);
}

/// Whether `plan` has a LOAD_BATCH instruction (needs a data source).
bool loadsBatches(const plan::Plan &plan) {
  for (const plan::Stream &stream : plan.streams())
    for (const plan::Instruction &inst : stream.instructions())
      if (inst.kind() == plan::Instruction::LOAD_BATCH)
        return true;
  return false;
}

/// Opens --data for a plan trained with `t` (null when there is no --data):
/// maps the file and checks its tokens against t's vocabulary and length.
Status openData(const RunOptions &options, const plan::TrainingConfig &t,
                uint64_t seed, std::unique_ptr<TokenFileData> &out) {
  out.reset();
  if (options.dataPath.empty())
    return Status::ok();
  TokenDType dtype;
  PIPER_RETURN_IF_ERROR(parseTokenDType(options.dataDType, dtype));
  Status st;
  out = openTokenFileData(options.dataPath, dtype, t.vocab_size(), t.seq_len(),
                          seed, st);
  return st;
}

/// Every parameter of the strategy, each name once, in class order (a tied
/// parameter held by several classes is one tensor of the checkpoint).
std::vector<ParamSpec> strategyParams(const std::vector<plan::Plan> &plans) {
  std::vector<ParamSpec> specs;
  std::set<std::string> seen;
  for (const plan::Plan &p : plans)
    for (const plan::Parameter &param : p.params())
      if (seen.insert(param.name()).second)
        specs.push_back(ParamSpec{
            param.name(), std::vector<int64_t>(param.type().shape().begin(),
                                               param.type().shape().end())});
  return specs;
}

/// Opens --load and checks it against the parameters of every plan (a
/// tensor that no class holds is an error too); sets `step` to its "step".
Status openCheckpoint(const RunOptions &options,
                      const std::vector<plan::Plan> &plans,
                      std::unique_ptr<SafetensorsReader> &out, int64_t &step) {
  Status st;
  out = SafetensorsReader::open(options.loadPath, st);
  if (!out)
    return st;
  PIPER_RETURN_IF_ERROR(checkpointStep(*out, step));
  return checkCheckpointParams(*out, strategyParams(plans),
                               /*rejectExtra=*/true);
}

/// Where replica 0 of device class `deviceClass` writes its parameters
/// before rank 0 merges them into --save.
std::string checkpointPartPath(const std::string &savePath, int deviceClass) {
  return savePath + ".class" + std::to_string(deviceClass) + ".part";
}

/// Reads and validates every plan of the manifest.
Status loadPlans(const RunOptions &options, const plan::Manifest &manifest,
                 std::vector<plan::Plan> &plans) {
  plans.assign(manifest.classes_size(), plan::Plan());
  std::vector<std::string> kernels = kernelNames();
  for (int c = 0; c < manifest.classes_size(); ++c) {
    PIPER_RETURN_IF_ERROR(loadPlan(options, manifest, c, plans[c]));
    PIPER_RETURN_IF_ERROR(
        validatePlan(plans[c], kernels)
            .withContext(
                "plan file '" +
                joinPath(options.outDir, manifest.classes(c).plan_file()) +
                "': invalid plan"));
  }
  return Status::ok();
}

/// Checks every plan, the strategy as a whole, and the files of --data,
/// --load and --save before any rank starts, so that a bad compile or a bad
/// file is one clear message, not N.
Status checkStrategy(const RunOptions &options,
                     const plan::Manifest &manifest) {
  std::vector<plan::Plan> plans;
  PIPER_RETURN_IF_ERROR(loadPlans(options, manifest, plans));
  PIPER_RETURN_IF_ERROR(
      validateStrategy(manifest, plans).withContext("invalid strategy"));
  if (!options.dataPath.empty()) {
    // Classes normally share one training config; check each distinct one.
    std::set<std::pair<int64_t, int64_t>> checked;
    for (const plan::Plan &p : plans) {
      const plan::TrainingConfig &t = p.training();
      if (!loadsBatches(p) ||
          !checked.insert({t.vocab_size(), t.seq_len()}).second)
        continue;
      std::unique_ptr<TokenFileData> data;
      PIPER_RETURN_IF_ERROR(openData(options, t, options.seed, data));
    }
  }
  if (!options.loadPath.empty()) {
    std::unique_ptr<SafetensorsReader> reader;
    int64_t step = 0;
    PIPER_RETURN_IF_ERROR(openCheckpoint(options, plans, reader, step));
  }
  if (!options.savePath.empty())
    PIPER_RETURN_IF_ERROR(makeDirectories(parentDirectory(options.savePath))
                              .withContext("--save"));
  return Status::ok();
}

/// After the last step: replica 0 of every class writes its parameters;
/// with several classes they write parts that rank 0 merges, in manifest
/// order, once every rank has passed a barrier.
Status writeCheckpoint(const std::string &path, bool gradients,
                       const plan::Manifest &manifest, Executor &exec,
                       Communicator *comm, int rank, int64_t step) {
  std::string who = "rank " + std::to_string(rank);
  PIPER_RETURN_IF_ERROR(
      makeDirectories(parentDirectory(path)).withContext(who + ": --save"));
  bool merge = manifest.classes_size() > 1;
  if (exec.replicaIndex() == 0)
    PIPER_RETURN_IF_ERROR(
        gradients
            ? exec.saveGradients(
                  merge ? checkpointPartPath(path, exec.plan().device_class())
                        : path,
                  step)
            : exec.saveCheckpoint(
                  merge ? checkpointPartPath(path, exec.plan().device_class())
                        : path,
                  step));
  if (!merge)
    return Status::ok();
  if (comm) {
    // A barrier: every part is complete once all ranks are past it. A rank
    // that failed to write has exited, which fails the sum on the others.
    double done = 1;
    PIPER_RETURN_IF_ERROR(comm->allReduceSumWorld(&done, 1).withContext(
        who + ": waiting for every class to write its checkpoint part"));
  }
  if (rank != 0)
    return Status::ok();
  std::vector<std::string> parts;
  for (const plan::Manifest::Class &c : manifest.classes())
    parts.push_back(checkpointPartPath(path, c.device_class()));
  PIPER_RETURN_IF_ERROR(mergeSafetensors(parts, path, checkpointMetadata(step))
                            .withContext(who + ": merging checkpoint parts"));
  for (const std::string &part : parts)
    std::remove(part.c_str());
  return Status::ok();
}

std::string describeExit(int status) {
  if (WIFEXITED(status))
    return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char *name = strsignal(sig);
    return "killed by signal " + std::to_string(sig) +
           (name ? std::string(", ") + name : std::string());
  }
  return "status " + std::to_string(status);
}

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
  for (auto &[pid, rank] : alive)
    ::kill(pid, SIGTERM);
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

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status); }

/// The process's peak resident set size (getrusage), in bytes.
int64_t maxRssBytes() {
  struct rusage usage;
  if (::getrusage(RUSAGE_SELF, &usage) != 0)
    return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024; // Linux: KiB
}

double mib(int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

/// "1234.5 MiB", or "unknown" for 0 (a plan from a compiler that does not
/// predict memory).
std::string predictedMiB(int64_t bytes) {
  if (bytes <= 0)
    return "unknown";
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f MiB", mib(bytes));
  return text;
}

/// The --profile table of one rank: every kernel op and instruction kind
/// by decreasing time, over `steps` steps that took `stepSeconds` in all.
std::string profileTable(const std::string &who, const Executor &exec,
                         int64_t firstStep, int64_t steps,
                         double stepSeconds) {
  std::vector<ProfileEntry> rows = exec.profile();
  int streams = exec.plan().streams_size();
  char line[256];
  std::string out;
  std::snprintf(line, sizeof(line),
                "profile of %s: steps %lld-%lld (%lld step%s%s), %d "
                "stream%s, %.3f ms/step, %s\n",
                who.c_str(), static_cast<long long>(firstStep),
                static_cast<long long>(firstStep + steps - 1),
                static_cast<long long>(steps), steps == 1 ? "" : "s",
                firstStep > 1 ? ", warm-up excluded" : ", warm-up included",
                streams, streams == 1 ? "" : "s",
                steps > 0 ? 1e3 * stepSeconds / double(steps) : 0.0,
                blasDescription().c_str());
  out += line;
  if (streams > 1)
    out += "  (streams run concurrently: their times overlap, so the "
           "percentages may add up to more than 100)\n";
  std::snprintf(line, sizeof(line), "  %-32s %9s %11s %10s %7s\n",
                "kernel / instruction", "count", "total ms", "ms/step",
                "% step");
  out += line;
  double kernels = 0, all = 0;
  std::set<std::string> ops;
  for (const std::string &op : kernelNames())
    ops.insert(op);
  for (const ProfileEntry &e : rows) {
    double perStep = steps > 0 ? 1e3 * e.seconds / double(steps) : 0.0;
    double pct = stepSeconds > 0 ? 100.0 * e.seconds / stepSeconds : 0.0;
    std::snprintf(line, sizeof(line), "  %-32s %9lld %11.3f %10.3f %7.2f\n",
                  e.name.c_str(), static_cast<long long>(e.count),
                  1e3 * e.seconds, perStep, pct);
    out += line;
    all += e.seconds;
    if (ops.count(e.name))
      kernels += e.seconds;
  }
  auto total = [&](const char *name, double seconds) {
    std::snprintf(line, sizeof(line), "  %-32s %9s %11.3f %10.3f %7.2f\n",
                  name, "", 1e3 * seconds,
                  steps > 0 ? 1e3 * seconds / double(steps) : 0.0,
                  stepSeconds > 0 ? 100.0 * seconds / stepSeconds : 0.0);
    out += line;
  };
  total("(all kernels)", kernels);
  total("(all rows)", all);
  total("(step wall time)", stepSeconds);
  return out;
}

} // namespace

int launchLocalRanks(const RunOptions &options, char **argv) {
  int n = options.nproc;

  char storeTemplate[4096];
  const char *tmp = std::getenv("TMPDIR");
  std::snprintf(storeTemplate, sizeof(storeTemplate), "%s/piper-run-XXXXXX",
                tmp && *tmp ? tmp : "/tmp");
  if (!::mkdtemp(storeTemplate)) {
    std::fprintf(stderr,
                 "piper-run: cannot create a rendezvous directory "
                 "'%s': %s\n",
                 storeTemplate, lowerErrno(errno).c_str());
    return 1;
  }
  std::string storeDir = storeTemplate;
  auto cleanup = [&] {
    std::error_code ec;
    std::filesystem::remove_all(storeDir, ec);
  };

  if (!options.logDir.empty()) {
    Status st = mkdirs(options.logDir);
    if (!st) {
      std::fprintf(stderr, "piper-run: %s\n", st.message().c_str());
      cleanup();
      return 1;
    }
  }

  // Ranks write "R\n" to this pipe just before they exit on an error. A
  // rank that dies makes its peers fail within microseconds, often before
  // the dying process is reapable, so the first line, not the first exit,
  // names the rank that failed first.
  int failurePipe[2];
  if (::pipe2(failurePipe, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "piper-run: cannot create a pipe: %s\n",
                 lowerErrno(errno).c_str());
    cleanup();
    return 1;
  }
  ::fcntl(failurePipe[0], F_SETFL, O_NONBLOCK);

  // Everything a child needs is built before fork: after it, the child may
  // only make async-signal-safe calls (the parent may have BLAS threads).
  std::vector<std::string> baseEnv;
  for (char **e = environ; *e; ++e) {
    std::string entry = *e;
    if (entry.rfind("PIPER_RANK=", 0) == 0 ||
        entry.rfind("PIPER_WORLD_SIZE=", 0) == 0 ||
        entry.rfind("PIPER_STORE_DIR=", 0) == 0 ||
        entry.rfind("PIPER_FAILURE_FD=", 0) == 0)
      continue;
    baseEnv.push_back(entry);
  }
  // N ranks with a full-width BLAS thread pool each would oversubscribe the
  // cores; share them out unless the user chose.
  bool blasThreadsSet = false;
  for (const std::string &entry : baseEnv)
    blasThreadsSet |= entry.rfind("OPENBLAS_NUM_THREADS=", 0) == 0 ||
                      entry.rfind("OMP_NUM_THREADS=", 0) == 0;
  if (!blasThreadsSet) {
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    baseEnv.push_back("OPENBLAS_NUM_THREADS=" +
                      std::to_string(std::max(1u, cores / unsigned(n))));
  }
  std::vector<std::vector<std::string>> envs(n, baseEnv);
  std::vector<std::vector<char *>> envPtrs(n);
  std::vector<std::string> logPaths(n);
  for (int r = 0; r < n; ++r) {
    envs[r].push_back("PIPER_RANK=" + std::to_string(r));
    envs[r].push_back("PIPER_WORLD_SIZE=" + std::to_string(n));
    envs[r].push_back("PIPER_STORE_DIR=" + storeDir);
    envs[r].push_back("PIPER_FAILURE_FD=" + std::to_string(failurePipe[1]));
    for (std::string &s : envs[r])
      envPtrs[r].push_back(s.data());
    envPtrs[r].push_back(nullptr);
    if (!options.logDir.empty())
      logPaths[r] = options.logDir + "/rank-" + std::to_string(r) + ".log";
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
  std::map<pid_t, int> alive;
  std::map<int, int> statuses; // exit status by rank, once reaped
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "piper-run: cannot start rank %d: %s\n", r,
                   lowerErrno(errno).c_str());
      stopAll(alive, statuses);
      cleanup();
      return 1;
    }
    if (pid == 0) {
      // Die with the launcher, so that no rank outlives a killed run.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent)
        ::_exit(1);
      // The write end must survive exec; dup2 onto itself would not clear
      // FD_CLOEXEC, so clear it by hand.
      ::fcntl(failurePipe[1], F_SETFD, 0);
      if (!logPaths[r].empty()) {
        int fd = ::open(logPaths[r].c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0)
          ::dup2(fd, STDERR_FILENO);
      }
      ::execve("/proc/self/exe", argv, envPtrs[r].data());
      const char msg[] = "piper-run: cannot exec /proc/self/exe\n";
      ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
      (void)ignored;
      ::_exit(127);
    }
    alive[pid] = r;
  }
  ::close(failurePipe[1]);

  std::vector<int> reported; // ranks in the order they reported failure
  std::string pending;
  auto drainPipe = [&] {
    char buf[256];
    ssize_t got;
    while ((got = ::read(failurePipe[0], buf, sizeof(buf))) > 0) {
      pending.append(buf, static_cast<size_t>(got));
      size_t eol;
      while ((eol = pending.find('\n')) != std::string::npos) {
        int r = std::atoi(pending.substr(0, eol).c_str());
        pending.erase(0, eol + 1);
        if (r >= 0 && r < n &&
            std::find(reported.begin(), reported.end(), r) == reported.end())
          reported.push_back(r);
      }
    }
  };
  std::vector<int> reapOrder; // failed ranks in the order they were reaped
  auto reapExited = [&] {
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
  };
  auto pollPipe = [&](int ms) {
    struct pollfd pfd = {failurePipe[0], POLLIN, 0};
    ::poll(&pfd, 1, ms); // EINTR just means: look again
  };

  bool interrupted = false;
  while (!alive.empty()) {
    pollPipe(50);
    if (stopSignal) {
      interrupted = true;
      break;
    }
    drainPipe();
    reapExited();
    if (!reported.empty() || !reapOrder.empty())
      break;
  }
  if (interrupted) {
    std::fprintf(stderr,
                 "piper-run: interrupted (signal %d), stopping %zu "
                 "ranks\n",
                 static_cast<int>(stopSignal), alive.size());
    stopAll(alive, statuses);
    ::close(failurePipe[0]);
    cleanup();
    return 128 + stopSignal;
  }
  if (reported.empty() && reapOrder.empty()) {
    ::close(failurePipe[0]);
    cleanup();
    return 0;
  }

  // Let a failure's direct consequences surface before naming a culprit: a
  // rank killed by a signal (a crash) writes no line, and its peers' lines
  // may come first.
  auto settle = Clock::now() + std::chrono::milliseconds(300);
  while (!alive.empty() && Clock::now() < settle) {
    pollPipe(20);
    drainPipe();
    reapExited();
  }
  int culprit = -1;
  for (int r : reapOrder)
    if (culprit < 0 && WIFSIGNALED(statuses[r]))
      culprit = r;
  if (culprit < 0)
    culprit = !reported.empty() ? reported.front() : reapOrder.front();
  size_t others = alive.size();
  stopAll(alive, statuses);
  drainPipe();
  ::close(failurePipe[0]);

  std::fprintf(stderr, "piper-run: rank %d failed (%s)\n", culprit,
               statuses.count(culprit) ? describeExit(statuses[culprit]).c_str()
                                       : "no exit status");
  if (!logPaths[culprit].empty())
    std::fprintf(stderr, "piper-run: end of %s:\n%s", logPaths[culprit].c_str(),
                 tailOf(logPaths[culprit], 20).c_str());
  for (int r : reapOrder)
    if (r != culprit)
      std::fprintf(stderr, "piper-run: rank %d also failed (%s)\n", r,
                   describeExit(statuses[r]).c_str());
  if (others > 0)
    std::fprintf(stderr, "piper-run: stopped the other %zu rank%s\n", others,
                 others == 1 ? "" : "s");
  cleanup();
  return 1;
}

int runRank(const RunOptions &options, int rank, int worldSize,
            const std::string &storeDir) {
  std::string who = "rank " + std::to_string(rank);
  // A failed rank leaves at once: tearing down a communicator whose peers
  // are stuck or gone could block, and the launcher is waiting to stop them.
  long long fd = -1;
  std::string fdError;
  if (envInt("PIPER_FAILURE_FD", fd, fdError) && fd >= 0) {
    failureFd = static_cast<int>(fd);
    failureLineSize = static_cast<size_t>(
        std::snprintf(failureLine, sizeof(failureLine), "%d\n", rank));
  }
  auto fail = [&](const std::string &message) -> int {
    reportFailure();
    std::fprintf(stderr, "piper-run: %s\n", message.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    ::_exit(1);
  };

  plan::Manifest manifest;
  Status st = loadManifest(options, manifest);
  if (!st)
    return fail(who + ": " + st.message());
  if (manifest.world_size() != worldSize)
    return fail(who + ": the strategy needs " +
                std::to_string(manifest.world_size()) +
                " ranks, PIPER_WORLD_SIZE is " + std::to_string(worldSize));
  int cls = -1;
  for (int c = 0; c < manifest.classes_size() && cls < 0; ++c)
    for (int r : manifest.classes(c).ranks())
      if (r == rank)
        cls = c;
  if (cls < 0)
    return fail(who + ": no device class of the manifest lists this rank");
  plan::Plan plan;
  st = loadPlan(options, manifest, cls, plan);
  if (!st)
    return fail(who + ": " + st.message());

  std::unique_ptr<TokenFileData> data;
  if (loadsBatches(plan)) {
    st = openData(options, plan.training(), options.seed, data);
    if (!st)
      return fail(who + ": " + st.message());
  }

  // --load is checked against every class's parameters, so that a tensor
  // no class holds is an error here too when ranks are started by hand.
  std::unique_ptr<SafetensorsReader> checkpoint;
  int64_t loadedStep = 0;
  if (!options.loadPath.empty()) {
    std::vector<plan::Plan> plans;
    st = loadPlans(options, manifest, plans);
    if (st)
      st = openCheckpoint(options, plans, checkpoint, loadedStep);
    if (!st)
      return fail(who + ": " + st.message());
  }

  std::unique_ptr<Communicator> comm;
  if (worldSize > 1) {
    comm = createGlooCommunicator(
        rank, worldSize, storeDir,
        std::chrono::milliseconds(int64_t(options.timeoutS) * 1000), st);
    if (!comm || !st)
      return fail(who + ": cannot create the communicator: " +
                  (st ? std::string("unknown error") : st.message()));
  }

  ExecutorOptions eo;
  eo.rank = rank;
  eo.seed = options.seed;
  eo.comm = comm.get();
  eo.data = data.get();
  // Exit at the first stream error instead of finishing the step: peers
  // blocked on this rank would otherwise wait for their timeout, while an
  // exit makes the launcher stop everyone now.
  eo.onStreamError = [](const Status &status) {
    reportFailure();
    std::fprintf(stderr, "piper-run: %s\n", status.message().c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    ::_exit(1);
  };
  const char *profileEnv = std::getenv("PIPER_PROFILE");
  eo.profile = options.profile ||
               (profileEnv && *profileEnv && std::strcmp(profileEnv, "0") != 0);
  // Reports of every rank go to its log with --log-dir; otherwise rank 0
  // speaks for itself on the shared terminal.
  const bool reports = rank == 0 || !options.logDir.empty();
  auto exec = Executor::create(plan, eo, st);
  if (!exec)
    return fail(st.message());
  if (checkpoint) {
    st = exec->loadCheckpoint(*checkpoint);
    if (!st)
      return fail(st.message());
    checkpoint.reset();
  }
  st = exec->connect();
  if (!st)
    return fail(st.message());

  long long failRank = -1, failStep = -1;
  std::string envError;
  if (!envInt("PIPER_TEST_FAIL_RANK", failRank, envError) ||
      !envInt("PIPER_TEST_FAIL_STEP", failStep, envError))
    failRank = failStep = -1;
  if (!envError.empty())
    return fail(who + ": " + envError);

  FILE *metrics = nullptr;
  if (rank == 0 && !options.metricsPath.empty()) {
    metrics = std::fopen(options.metricsPath.c_str(), "w");
    if (!metrics)
      return fail(who + ": cannot open --metrics file '" + options.metricsPath +
                  "': " + lowerErrno(errno));
  }
  const plan::TrainingConfig &t = manifest.training().num_microbatches() > 0
                                      ? manifest.training()
                                      : plan.training();
  double tokensPerStep = double(std::max(1, t.num_replicas())) *
                         t.num_microbatches() * t.microbatch_size() *
                         t.seq_len();

  // After --load, step numbers continue from the checkpoint's: the data
  // windows and AdamW's bias correction see the steps they would have.
  int64_t lastStep = loadedStep + options.steps;
  // --profile leaves out the first step (allocator and BLAS warm-up) unless
  // it is the only one.
  int64_t profiledFrom = loadedStep + 1;
  double profiledSeconds = 0;
  for (int64_t step = loadedStep + 1; step <= lastStep; ++step) {
    if (rank == failRank && step == failStep) {
      reportFailure();
      std::fprintf(stderr,
                   "piper-run: %s: failing at the start of step %lld on "
                   "purpose (PIPER_TEST_FAIL_RANK/PIPER_TEST_FAIL_STEP)\n",
                   who.c_str(), static_cast<long long>(step));
      std::fflush(stderr);
      std::fflush(stdout);
      ::_exit(3);
    }
    auto start = Clock::now();
    double loss = 0;
    st = exec->runStep(step, loss);
    if (!st)
      return fail(st.message());
    double seconds =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (eo.profile && step == loadedStep + 1 && lastStep > step) {
      exec->resetProfile();
      profiledFrom = step + 1;
    } else {
      profiledSeconds += seconds;
    }
    if (rank != 0)
      continue;
    double tokensPerS = seconds > 0 ? tokensPerStep / seconds : 0.0;
    std::printf("step %lld | loss %.9g | %.0f tokens/s\n",
                static_cast<long long>(step), loss, tokensPerS);
    std::fflush(stdout);
    if (metrics) {
      char lossText[64];
      if (std::isfinite(loss))
        std::snprintf(lossText, sizeof(lossText), "%.17g", loss);
      else
        std::snprintf(lossText, sizeof(lossText), "null");
      char normText[64] = "null";
      if (exec->lastGradNorm() >= 0 && std::isfinite(exec->lastGradNorm()))
        std::snprintf(normText, sizeof(normText), "%.9g", exec->lastGradNorm());
      double lr = exec->plan().training().lr() * exec->lrScale(step);
      std::fprintf(metrics,
                   "{\"step\": %lld, \"loss\": %s, \"tokens_per_s\": %.3f, "
                   "\"step_time_s\": %.6f, \"lr\": %.9g, \"grad_norm\": %s, "
                   "\"peak_bytes\": %lld, \"max_rss_bytes\": %lld}\n",
                   static_cast<long long>(step), lossText, tokensPerS, seconds,
                   lr, normText, static_cast<long long>(exec->peakBytes()),
                   static_cast<long long>(maxRssBytes()));
      std::fflush(metrics);
    }
  }
  if (metrics && std::fclose(metrics) != 0)
    return fail(who + ": cannot write --metrics file '" + options.metricsPath +
                "'");
  if (reports) {
    if (eo.profile && lastStep >= profiledFrom)
      std::fprintf(stderr, "%s",
                   profileTable(who, *exec, profiledFrom,
                                lastStep - profiledFrom + 1, profiledSeconds)
                       .c_str());
    // The runtime's own high-water mark (persistent state plus step
    // buffers and segment values), next to the compiler's prediction.
    std::fprintf(stderr,
                 "piper-run: %s: peak memory: %.1f MiB (compiler predicted "
                 "%s); state %.1f MiB (predicted %s); max RSS %.1f MiB\n",
                 who.c_str(), mib(exec->peakBytes()),
                 predictedMiB(exec->plan().predicted_peak_bytes()).c_str(),
                 mib(exec->stateBytes()),
                 predictedMiB(exec->plan().predicted_state_bytes()).c_str(),
                 mib(maxRssBytes()));
    std::fflush(stderr);
  }

  if (!options.saveParamsDir.empty() && exec->replicaIndex() == 0) {
    st = exec->saveParams(options.saveParamsDir);
    if (!st)
      return fail(st.message());
  }
  if (!options.savePath.empty()) {
    st = writeCheckpoint(options.savePath, false, manifest, *exec, comm.get(),
                         rank, lastStep);
    if (!st)
      return fail(st.message());
  }
  if (!options.saveGradsPath.empty()) {
    st = writeCheckpoint(options.saveGradsPath, true, manifest, *exec,
                         comm.get(), rank, lastStep);
    if (!st)
      return fail(st.message());
  }
  return 0;
}

int piperRunMain(int argc, char **argv) {
  RunOptions options;
  CLI::App app{"piper-run: runs a compiled Piper strategy on local CPU "
               "processes (docs/piper-run.md)",
               "piper-run"};
  app.add_option("out", options.outDir,
                 "compiled strategy folder (manifest.textproto + plans)")
      ->required();
  app.add_option("--nproc", options.nproc,
                 "number of ranks to spawn; must equal the strategy's "
                 "world size");
  app.add_option("--backend", options.backend, "execution backend (cpu)")
      ->capture_default_str();
  app.add_option("--steps", options.steps,
                 "training steps to run (0: only --load/--save)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--seed", options.seed,
                 "seed of parameter init and of the data (synthetic "
                 "sequences or token-file windows)")
      ->capture_default_str();
  app.add_option("--metrics", options.metricsPath,
                 "JSON-lines file rank 0 writes one object per step to");
  app.add_option("--timeout-s", options.timeoutS,
                 "seconds a communication may wait before failing")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--save-params", options.saveParamsDir,
                 "after the last step, write DIR/<param>.bin (fp32)");
  app.add_option("--log-dir", options.logDir,
                 "write each spawned rank's stderr to DIR/rank-<R>.log");
  CLI::Option *data = app.add_option(
      "--data", options.dataPath,
      "train on windows of this token file instead of synthetic data "
      "(docs/data.md)");
  app.add_option("--data-dtype", options.dataDType,
                 "token width of --data: uint16 or uint32 (default: the "
                 "file's header, else uint16)")
      ->check(CLI::IsMember({"uint16", "uint32"}))
      ->needs(data);
  app.add_option("--save-grads", options.saveGradsPath,
                 "after the last step, write the gradient accumulators to "
                 "this safetensors file (meaningful for plans compiled with "
                 "piperc --no-optimizer, whose gradients are never cleared)");
  app.add_option("--save", options.savePath,
                 "after the last step, write all parameters to this "
                 "safetensors file");
  app.add_option("--load", options.loadPath,
                 "before the first step, read all parameters from this "
                 "safetensors file (instead of initializing them)");
  app.add_flag("--profile", options.profile,
               "time every kernel op and instruction kind (first step "
               "excluded) and print a table at the end; also PIPER_PROFILE=1");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }

  std::string envError;
  long long rank = -1, world = -1;
  bool haveRank = envInt("PIPER_RANK", rank, envError);
  if (!envError.empty()) {
    std::fprintf(stderr, "piper-run: %s\n", envError.c_str());
    return 1;
  }

  if (haveRank) {
    // One rank of a run: spawned by the launcher below, or by hand / a
    // cluster launcher with the same variables.
    if (!envInt("PIPER_WORLD_SIZE", world, envError) || world < 1) {
      std::fprintf(stderr, "piper-run: %s\n",
                   envError.empty()
                       ? "PIPER_RANK is set but PIPER_WORLD_SIZE is not"
                       : envError.c_str());
      return 1;
    }
    if (rank < 0 || rank >= world) {
      std::fprintf(stderr,
                   "piper-run: PIPER_RANK %lld is out of range for "
                   "PIPER_WORLD_SIZE %lld\n",
                   rank, world);
      return 1;
    }
    if (options.nproc != 0 && options.nproc != world) {
      std::fprintf(stderr,
                   "piper-run: --nproc is %d but PIPER_WORLD_SIZE is %lld\n",
                   options.nproc, world);
      return 1;
    }
    const char *store = std::getenv("PIPER_STORE_DIR");
    if (world > 1 && (!store || !*store)) {
      std::fprintf(stderr, "piper-run: PIPER_STORE_DIR must name a shared, "
                           "empty directory when PIPER_WORLD_SIZE > 1\n");
      return 1;
    }
    return runRank(options, static_cast<int>(rank), static_cast<int>(world),
                   store ? store : "");
  }

  plan::Manifest manifest;
  Status st = loadManifest(options, manifest);
  if (!st) {
    std::fprintf(stderr, "piper-run: %s\n", st.message().c_str());
    return 1;
  }
  if (options.nproc <= 0) {
    std::fprintf(stderr,
                 "piper-run: --nproc is required (the strategy "
                 "needs %d ranks)\n",
                 manifest.world_size());
    return 1;
  }
  if (options.nproc != manifest.world_size()) {
    std::fprintf(stderr, "piper-run: strategy needs %d ranks, --nproc is %d\n",
                 manifest.world_size(), options.nproc);
    return 1;
  }
  st = checkStrategy(options, manifest);
  if (!st) {
    std::fprintf(stderr, "piper-run: %s\n", st.message().c_str());
    return 1;
  }
  return launchLocalRanks(options, argv);
}

} // namespace piper::runtime
