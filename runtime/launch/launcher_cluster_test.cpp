// End-to-end tests of piper-run under other launchers: torchrun-style
// variables for two "nodes" on distinct loopback addresses, Open MPI's
// mpirun, and the TCP rendezvous's errors (a rank that never comes, another
// job's rank). Only loopback addresses (127.0.0.x).
#include <netinet/in.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include <filesystem>

#include "runtime/launch/launcher_test_util.h"

using namespace piper;
using namespace piper::launchertest;

namespace {

/// A TCP port nobody listens on at `host` now.
int freePort(const char *host) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  REQUIRE(::inet_pton(AF_INET, host, &addr.sin_addr) == 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

/// Runs one piper-run per entry of `envs` at once (each with `args` and its
/// extra environment) and returns their results in order. (Processes, not
/// threads: Catch's assertions are not thread-safe.)
std::vector<RunResult> runAll(const std::vector<std::string> &args,
                              const std::vector<std::vector<std::string>> &envs,
                              std::chrono::seconds timeout) {
  struct Started {
    pid_t pid;
    std::string outPath, errPath;
  };
  std::vector<Started> started;
  std::vector<std::string> argStrings = {kPiperRun};
  argStrings.insert(argStrings.end(), args.begin(), args.end());
  for (const std::vector<std::string> &extra : envs) {
    std::string dir = tempDir("rank");
    Started s{-1, dir + "/stdout", dir + "/stderr"};
    std::vector<std::string> envStrings;
    for (char **e = environ; *e; ++e)
      envStrings.push_back(*e);
    envStrings.insert(envStrings.end(), extra.begin(), extra.end());
    std::vector<char *> argv, envp;
    for (std::string &a : argStrings)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string &e : envStrings)
      envp.push_back(e.data());
    envp.push_back(nullptr);
    std::fflush(nullptr);
    s.pid = ::fork();
    REQUIRE(s.pid >= 0);
    if (s.pid == 0) {
      int out = ::open(s.outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(s.errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      ::execve(kPiperRun, argv.data(), envp.data());
      ::_exit(127);
    }
    started.push_back(s);
  }
  auto start = std::chrono::steady_clock::now();
  std::vector<RunResult> results(started.size());
  for (size_t i = 0; i < started.size(); ++i) {
    RunResult &r = results[i];
    while (::waitpid(started[i].pid, &r.status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() - start > timeout) {
        r.timedOut = true;
        ::kill(started[i].pid, SIGKILL);
        ::waitpid(started[i].pid, &r.status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    r.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    r.out = readFile(started[i].outPath);
    r.err = readFile(started[i].errPath);
  }
  return results;
}

/// The metrics lines of a file, as written (losses compared bit for bit).
std::vector<std::string> lossTexts(const std::string &path) {
  std::vector<std::string> out;
  std::istringstream in(readFile(path));
  std::string line;
  std::regex loss(R"("loss": ([^,]+),)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, loss))
      out.push_back(m[1]);
  }
  return out;
}

/// Trains `out` with `nproc` local ranks and returns the losses.
std::vector<std::string> localLosses(const std::string &out, int nproc) {
  std::string metrics = out + "/local.jsonl";
  RunResult r = piperRun({out, "--nproc", std::to_string(nproc), "--steps", "3",
                          "--seed", "5", "--metrics", metrics});
  INFO("stderr: " << r.err);
  REQUIRE(r.exitCode() == 0);
  std::vector<std::string> losses = lossTexts(metrics);
  REQUIRE(losses.size() == 3);
  return losses;
}

/// The variables torchrun sets for `rank` of `world`.
std::vector<std::string> torchrunEnv(int rank, int world, int localRank,
                                     const std::string &master, int port) {
  return {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world),
          "LOCAL_RANK=" + std::to_string(localRank), "MASTER_ADDR=" + master,
          "MASTER_PORT=" + std::to_string(port)};
}

} // namespace

TEST_CASE("piper-run under torchrun-style variables: two nodes on loopback "
          "addresses match the local spawn bit for bit",
          "[launcher][cluster]") {
  TinyModel m;
  std::string out = strategy({singleClassPlan(m, 1, {0, 1, 2, 3}, 4)}, "tr4");
  std::vector<std::string> local = localLosses(out, 4);

  // Node A is 127.0.0.2 (the master, ranks 0 and 1), node B 127.0.0.3
  // (ranks 2 and 3, whose pairs bind there).
  int port = freePort("127.0.0.2");
  std::string metrics = out + "/torchrun.jsonl";
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < 4; ++r) {
    envs.push_back(torchrunEnv(r, 4, r % 2, "127.0.0.2", port));
    if (r >= 2)
      envs.back().push_back("PIPER_HOST_ADDR=127.0.0.3");
  }
  std::vector<RunResult> runs =
      runAll({out, "--steps", "3", "--seed", "5", "--metrics", metrics,
              "--timeout-s", "30", "--log-dir", out + "/logs"},
             envs, std::chrono::seconds(90));
  for (size_t r = 0; r < runs.size(); ++r) {
    INFO("rank " << r << " stderr: " << runs[r].err);
    CHECK(runs[r].exitCode() == 0);
    // Each rank writes its own log (--log-dir), and each node's pairs bind
    // its own address.
    std::string log =
        readFile(out + "/logs/rank-" + std::to_string(r) + ".log");
    CHECK(log.find("piper-run: rank " + std::to_string(r) +
                   " of 4 (torchrun, local rank " + std::to_string(r % 2) +
                   "): met at 127.0.0.2:" + std::to_string(port) +
                   ", gloo binds " + (r < 2 ? "127.0.0.2" : "127.0.0.3") +
                   "\n") != std::string::npos);
  }
  CHECK(lossTexts(metrics) == local);
}

TEST_CASE("piper-run under mpirun matches the local spawn bit for bit",
          "[launcher][cluster]") {
  if (::access("/usr/bin/mpirun", X_OK) != 0) {
    // scripts/setup.sh installs openmpi-bin; say so rather than pass.
    FAIL("mpirun is missing: run scripts/setup.sh (Debian's openmpi-bin)");
  }
  TinyModel m;
  std::string out = strategy({singleClassPlan(m, 1, {0, 1, 2, 3}, 4)}, "mpi4");
  std::vector<std::string> local = localLosses(out, 4);
  std::string metrics = out + "/mpirun.jsonl";
  std::string piperRunPath = std::filesystem::absolute(kPiperRun).string();
  RunResult r =
      runBinary("/usr/bin/mpirun",
                {"--oversubscribe", "--allow-run-as-root", "-np", "4", "-x",
                 "MASTER_PORT=" + std::to_string(freePort("127.0.0.1")),
                 piperRunPath, out, "--steps", "3", "--seed", "5", "--metrics",
                 metrics, "--timeout-s", "30", "--profile"},
                {}, std::chrono::seconds(120));
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.exitCode() == 0);
  CHECK(lossTexts(metrics) == local);
  // The 4 ranks of this machine share its cores, as the local spawn's do,
  // unless the user chose a thread count (OPENBLAS_NUM_THREADS, as
  // OPENBLAS_CORETYPE=... OPENBLAS_NUM_THREADS=2 scripts/test.sh sets).
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::string threads =
      ", " + std::to_string(std::max(1u, cores / 4)) + " thread(s)";
  const char *chosen = std::getenv("OPENBLAS_NUM_THREADS");
  if (chosen && *chosen)
    threads = ", " + std::string(chosen) + " thread(s)";
  CHECK(r.err.find(threads) != std::string::npos);
}

TEST_CASE("piper-run's TCP rendezvous: a missing rank and another job's rank "
          "are errors within --timeout-s",
          "[launcher][cluster]") {
  SECTION("a launcher's world that is not the strategy's") {
    TinyModel m;
    std::string out = strategy(pipelinePlans(m, 2), "rdv-world");
    RunResult r = piperRun({out}, torchrunEnv(0, 3, 0, "127.0.0.1", 1));
    CHECK(r.exitCode() == 1);
    CHECK(r.err == "piper-run: rank 0: the strategy needs 2 ranks, the "
                   "torchrun world has 3\n");
  }
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "rdv");
  int port = freePort("127.0.0.1");
  std::string where = "127.0.0.1:" + std::to_string(port);
  std::vector<std::string> args = {out, "--steps", "1", "--timeout-s", "2"};

  SECTION("rank 1 never comes") {
    RunResult r = piperRun(args, torchrunEnv(0, 2, 0, "127.0.0.1", port),
                           std::chrono::seconds(30));
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.exitCode() == 1);
    CHECK(r.err == "piper-run: rank 0: rank 1 did not join the rendezvous at " +
                       where + " within 2 s (--timeout-s)\n");
    CHECK(r.seconds < 10);
  }
  SECTION("rank 0 never comes") {
    RunResult r = piperRun(args, torchrunEnv(1, 2, 0, "127.0.0.1", port),
                           std::chrono::seconds(30));
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.exitCode() == 1);
    CHECK(r.err.find("piper-run: rank 1: cannot reach the rendezvous store "
                     "at " +
                     where + " within 2 s") != std::string::npos);
    CHECK(r.seconds < 10);
  }
  SECTION("a rank of another job is refused") {
    std::vector<std::string> a = torchrunEnv(0, 2, 0, "127.0.0.1", port);
    a.push_back("PIPER_JOB_ID=job-a");
    std::vector<std::string> b = torchrunEnv(1, 2, 0, "127.0.0.1", port);
    b.push_back("PIPER_JOB_ID=job-b");
    std::vector<RunResult> runs =
        runAll(args, {a, b}, std::chrono::seconds(30));
    CHECK(runs[1].exitCode() == 1);
    // Both jobs are named: same strategy and options, other job ids.
    CHECK(std::regex_search(
        runs[1].err,
        std::regex("piper-run: rank 1: the rendezvous store at " + where +
                   " refused rank 1: rank 1 is of job "
                   "'torchrun:job-b/([0-9a-f]{16})', but this store serves "
                   "job 'torchrun:job-a/\\1' ")));
    CHECK(runs[0].exitCode() == 1);
    CHECK(runs[0].err.find("rank 1 did not join the rendezvous") !=
          std::string::npos);
  }
}

TEST_CASE("piper-run under torchrun-style variables: the watchdog works "
          "through the TCP store",
          "[launcher][cluster][watchdog]") {
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "tcp-watch");
  // Rank 1 hangs in a SEND; then rank 0, which serves the store, crashes.
  for (const char *fault : {"rank=1,step=2,inst=4,action=hang_comm",
                            "rank=0,step=2,inst=1,action=crash"}) {
    int culprit = fault[5] - '0';
    int port = freePort("127.0.0.1");
    std::vector<std::vector<std::string>> envs;
    for (int r = 0; r < 2; ++r) {
      envs.push_back(torchrunEnv(r, 2, r, "127.0.0.1", port));
      envs.back().push_back(std::string("PIPER_FAULT=") + fault);
    }
    auto start = std::chrono::steady_clock::now();
    std::vector<RunResult> runs = runAll(
        {out, "--steps", "100000000", "--timeout-s", "3"}, envs,
        std::chrono::seconds(30));
    double seconds = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start)
                         .count();
    std::printf("launcher_cluster_test: TCP store, %s: every rank stopped "
                "%.2f s after the start\n",
                fault, seconds);
    int other = 1 - culprit;
    INFO("fault " << fault << "\nrank 0 stderr: " << runs[0].err
                  << "\nrank 1 stderr: " << runs[1].err);
    REQUIRE_FALSE(runs[other].timedOut);
    CHECK(runs[other].exitCode() == 4);
    CHECK(runs[other].err.find("piper-run: rank " + std::to_string(other) +
                               ": watchdog: rank " + std::to_string(culprit) +
                               " failed: ") != std::string::npos);
    // A crashed rank 0 takes the TCP store, and every heartbeat in it,
    // along: under load rank 1 may not have read one before the crash.
    bool position = runs[other].err.find("  rank " + std::to_string(culprit) +
                                         ": step ") != std::string::npos;
    bool unseen = culprit == 0 &&
                  runs[other].err.find("  rank 0: no heartbeat seen  <-- "
                                       "failed") != std::string::npos;
    CHECK((position || unseen));
    if (culprit == 1) {
      // (A crashed rank 0 takes the store with it: its last heartbeat
      // readable may be older.)
      CHECK(runs[0].err.find("  rank 1: step 2, run, no progress for ") !=
            std::string::npos);
      CHECK(runs[1].exitCode() == 1);
      CHECK(runs[1].err.find("stream 'main' instruction 4 SEND 'send dx "
                             "MB=0': to rank 0") != std::string::npos);
    } else {
      CHECK(WIFSIGNALED(runs[0].status));
    }
    // Startup, step 1, then --timeout-s 3 and the verdict.
    CHECK(seconds < 3 + 5 + 3);
  }
}
