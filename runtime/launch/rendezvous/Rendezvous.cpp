// The PIPER_* environment protocol between launcher and ranks, the
// rendezvous folder and the failure pipe (docs/piper-run.md).
#include "runtime/launch/rendezvous/Rendezvous.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>

#include <sys/random.h>
#include <unistd.h>

#include <fmt/format.h>

#include "support/AtomicFile.h"
#include "support/Errno.h"

extern char **environ;

namespace piper::runtime {

namespace {

/// The variables of the protocol; a launcher never passes its own on.
constexpr const char *kProtocolVars[] = {
    "PIPER_RANK",       "PIPER_WORLD_SIZE", "PIPER_STORE_DIR",
    "PIPER_FAILURE_FD", "PIPER_ATTEMPT",    "PIPER_RESTART_FAILED_AT_NS",
    // --standby (Standby.h)
    "PIPER_STANDBY", "PIPER_STANDBY_FD", "PIPER_HANDOFF_DIR",
    "PIPER_RECOVERY_DIR", "PIPER_RECOVERY_NOTE"};

/// Whether the environment entry `entry` ("NAME=value") sets `name`.
bool sets(const std::string &entry, const char *name) {
  return entry.rfind(std::string(name) + "=", 0) == 0;
}

/// The launcher's failure pipe and this rank's line for it, prepared in
/// advance so that reportFailure() only calls write(); -1 when the rank was
/// not started by piper-run's launcher.
int failureFd = -1;
char failureLine[24];
size_t failureLineSize = 0;

std::atomic<ExitHook> exitHook{nullptr};

} // namespace

bool envInt(const char *name, long long &value, std::string &error) {
  const char *text = std::getenv(name);
  if (!text || !*text)
    return false;
  char *end = nullptr;
  errno = 0;
  value = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0') {
    error = fmt::format("{}='{}' is not an integer", name, text);
    return false;
  }
  return true;
}

std::string localJobId() {
  const char *set = std::getenv("PIPER_JOB_ID");
  if (set && *set)
    return set;
  uint64_t random = 0;
  if (::getrandom(&random, sizeof(random), 0) != ssize_t(sizeof(random)))
    random = uint64_t(std::time(nullptr)) * 1000003u ^ uint64_t(::getpid());
  std::string id = fmt::format("local-{:016x}", random);
  ::setenv("PIPER_JOB_ID", id.c_str(), 1);
  return id;
}

Status makeStoreDir(std::string &dir) {
  const char *tmp = std::getenv("TMPDIR");
  dir = fmt::format("{}/piper-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!::mkdtemp(dir.data()))
    return Status::error(
        fmt::format("cannot create a rendezvous directory '{}': {}", dir,
                    errnoMessage(errno)));
  return Status::ok();
}

std::vector<std::string> inheritedEnvironment(int nproc) {
  std::vector<std::string> env;
  bool blasThreadsSet = false;
  for (char **e = environ; *e; ++e) {
    std::string entry = *e;
    if (std::any_of(std::begin(kProtocolVars), std::end(kProtocolVars),
                    [&](const char *name) { return sets(entry, name); }))
      continue;
    blasThreadsSet |=
        sets(entry, "OPENBLAS_NUM_THREADS") || sets(entry, "OMP_NUM_THREADS");
    env.push_back(std::move(entry));
  }
  // N ranks with a full-width BLAS thread pool each would oversubscribe the
  // cores; share them out unless the user chose.
  if (!blasThreadsSet) {
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    env.push_back(fmt::format("OPENBLAS_NUM_THREADS={}",
                              std::max(1u, cores / unsigned(nproc))));
  }
  return env;
}

std::vector<std::string> rankEnvironment(std::vector<std::string> base,
                                         int rank, int worldSize,
                                         const std::string &storeDir,
                                         int failureFd) {
  base.push_back(fmt::format("PIPER_RANK={}", rank));
  base.push_back(fmt::format("PIPER_WORLD_SIZE={}", worldSize));
  base.push_back("PIPER_STORE_DIR=" + storeDir);
  base.push_back(fmt::format("PIPER_FAILURE_FD={}", failureFd));
  return base;
}

void initFailureReport(int rank) {
  long long fd = -1;
  std::string error;
  if (!envInt("PIPER_FAILURE_FD", fd, error) || fd < 0)
    return;
  failureFd = static_cast<int>(fd);
  failureLineSize = static_cast<size_t>(
      std::snprintf(failureLine, sizeof(failureLine), "%d\n", rank));
}

void reportFailure() {
  if (failureFd < 0)
    return;
  ssize_t ignored = ::write(failureFd, failureLine, failureLineSize);
  (void)ignored;
  failureFd = -1;
}

void setExitHook(ExitHook hook) { exitHook.store(hook); }

void exitRank(const std::string &message, int code) {
  if (ExitHook hook = exitHook.exchange(nullptr))
    hook(message);
  reportFailure();
  // _exit runs no destructors: half-written files go by hand.
  removeTempFiles();
  std::fprintf(stderr, "piper-run: %s\n", message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  ::_exit(code);
}

} // namespace piper::runtime
