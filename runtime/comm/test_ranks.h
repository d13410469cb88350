// Internal to runtime/comm tests: runs a body in one forked process per rank
// (each reports through its exit code; the parent kills stragglers) and the
// CHILD_* checks that fail a rank.
#ifndef PIPER_RUNTIME_COMM_TEST_RANKS_H
#define PIPER_RUNTIME_COMM_TEST_RANKS_H

#include "runtime/comm/Communicator.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace piper::runtime::testranks {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// Fails the calling rank (its exit code) when `cond` is false.
#define CHILD_CHECK(cond)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "rank %d: line %d: check failed: %s\n", rank,       \
                   __LINE__, #cond);                                           \
      return 1;                                                                \
    }                                                                          \
  } while (0)

/// Fails the calling rank when `expr` yields an error status.
#define CHILD_OK(expr)                                                         \
  do {                                                                         \
    ::piper::Status childStatus_ = (expr);                            \
    if (!childStatus_.isOk()) {                                                \
      std::fprintf(stderr, "rank %d: line %d: %s\n", rank, __LINE__,           \
                   childStatus_.message().c_str());                            \
      return 1;                                                                \
    }                                                                          \
  } while (0)

/// Fails the calling rank unless `expr` yields an error containing `needle`.
#define CHILD_FAILS_WITH(expr, needle)                                         \
  do {                                                                         \
    ::piper::Status childStatus_ = (expr);                            \
    if (childStatus_.isOk() ||                                                 \
        childStatus_.message().find(needle) == std::string::npos) {            \
      std::fprintf(stderr,                                                     \
                   "rank %d: line %d: expected an error with '%s', "           \
                   "got '%s'\n",                                               \
                   rank, __LINE__, std::string(needle).c_str(),                \
                   childStatus_.isOk() ? "ok"                                  \
                                       : childStatus_.message().c_str());      \
      return 1;                                                                \
    }                                                                          \
  } while (0)

using RankBody = std::function<int(int rank, const std::string &storeDir)>;

/// A fresh rendezvous directory under the test's temporary directory.
inline std::string makeStoreDir() {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/comm_XXXXXX";
  if (!mkdtemp(dir.data()))
    FAIL("mkdtemp: " << std::strerror(errno));
  return dir;
}

/// Runs `body` in `worldSize` forked processes, one per rank, and returns
/// their exit codes; a child still running at `deadline` is killed and
/// reported as 128 + SIGKILL, one killed by a signal as 128 + signal.
inline std::vector<int> runRanks(int worldSize,
                                 std::chrono::milliseconds deadline,
                                 const RankBody &body) {
  std::string storeDir = makeStoreDir();
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < worldSize; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = body(rank, storeDir);
      } catch (const std::exception &e) {
        std::fprintf(stderr, "rank %d: exception: %s\n", rank, e.what());
      }
      std::fflush(stderr);
      _exit(code);
    }
    if (pid < 0) {
      for (pid_t started : pids) {
        kill(started, SIGKILL);
        waitpid(started, nullptr, 0);
      }
      FAIL("fork: " << std::strerror(errno));
    }
    pids.push_back(pid);
  }

  std::vector<int> codes(worldSize, -1);
  int running = worldSize;
  auto end = Clock::now() + deadline;
  while (running > 0 && Clock::now() < end) {
    for (int rank = 0; rank < worldSize; ++rank) {
      int status = 0;
      if (codes[rank] != -1 || waitpid(pids[rank], &status, WNOHANG) == 0)
        continue;
      codes[rank] =
          WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      --running;
    }
    std::this_thread::sleep_for(10ms);
  }
  for (int rank = 0; rank < worldSize; ++rank) {
    if (codes[rank] != -1)
      continue;
    std::fprintf(stderr, "rank %d: still running at the deadline; killed\n",
                 rank);
    kill(pids[rank], SIGKILL);
    waitpid(pids[rank], nullptr, 0);
    codes[rank] = 128 + SIGKILL;
  }
  return codes;
}

/// Checks that every rank exited with 0.
inline void requireAllPassed(const std::vector<int> &codes) {
  for (size_t rank = 0; rank < codes.size(); ++rank) {
    INFO("rank " << rank);
    CHECK(codes[rank] == 0);
  }
}

inline std::unique_ptr<Communicator>
makeComm(int rank, int worldSize, const std::string &storeDir,
         std::chrono::milliseconds timeout) {
  Status status;
  auto comm =
      createGlooCommunicator(rank, worldSize, storeDir, timeout, status);
  if (!comm)
    std::fprintf(stderr, "rank %d: %s\n", rank, status.message().c_str());
  return comm;
}

} // namespace piper::runtime::testranks

#endif // PIPER_RUNTIME_COMM_TEST_RANKS_H
