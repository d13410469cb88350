// End-to-end tests of job isolation: two jobs on one MASTER_PORT never join
// each other (the stranger is refused, naming both jobs), and two jobs on one
// --checkpoint-dir never run together (the second is refused at start while
// the first keeps going; restarts and spares of one job are not locked
// out), and strangers flooding the port do not keep a job's rank out.
// Loopback addresses only; every wait is bounded.
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include <filesystem>

#include "runtime/launch/launcher_test_util.h"

using namespace piper;
using namespace piper::launchertest;

namespace {

/// A TCP port nobody listens on at 127.0.0.1 now.
int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

/// `n` connections to 127.0.0.1:`port` that never say hello (every tenth
/// sends the first 7 bytes of one); fewer when they cannot be opened.
std::vector<int> strangers(int port, int n) {
  std::vector<int> fds;
  const std::string half("\x0e\x00\x00\x00H\x05\x00", 7);
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      break;
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      break;
    }
    if (i % 10 == 0 &&
        ::send(fd, half.data(), half.size(), MSG_NOSIGNAL) != 7) {
      ::close(fd);
      break;
    }
    fds.push_back(fd);
  }
  return fds;
}

/// A piper-run started in the background.
struct Started {
  pid_t pid = -1;
  std::string outPath, errPath;
  std::chrono::steady_clock::time_point start;
};

Started startRun(const std::vector<std::string> &args,
                 const std::vector<std::string> &env) {
  Started s;
  std::string dir = tempDir("job");
  s.outPath = dir + "/stdout";
  s.errPath = dir + "/stderr";
  s.start = std::chrono::steady_clock::now();
  s.pid = spawnBinary(kPiperRun, args, env, s.outPath, s.errPath);
  return s;
}

/// Waits for `s` to end, killing it after `timeout`.
RunResult finish(const Started &s, std::chrono::seconds timeout) {
  RunResult r;
  while (::waitpid(s.pid, &r.status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - s.start > timeout) {
      r.timedOut = true;
      ::kill(s.pid, SIGKILL);
      ::waitpid(s.pid, &r.status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - s.start)
          .count();
  r.out = readFile(s.outPath);
  r.err = readFile(s.errPath);
  return r;
}

std::vector<std::string> torchrunEnv(int rank, int world, int port) {
  return {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world),
          "LOCAL_RANK=" + std::to_string(rank), "MASTER_ADDR=127.0.0.1",
          "MASTER_PORT=" + std::to_string(port)};
}

/// The newest step-<N> directory of `dir`, 0 when none.
int newestStep(const std::string &dir) {
  int newest = 0;
  std::error_code ec;
  for (const auto &e : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 &&
        name.find_first_not_of("0123456789", 5) == std::string::npos)
      newest = std::max(newest, std::stoi(name.substr(5)));
  }
  return newest;
}

/// Polls `done` every 20 ms until it holds or `timeout` passes.
template <typename F> bool waitFor(F done, std::chrono::seconds timeout) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

} // namespace

TEST_CASE("two jobs on one MASTER_PORT: the stranger is refused, naming both "
          "jobs, and the job trains alone, its rank 1 let in among 1,000 "
          "connections that never say hello",
          "[launcher][jobs]") {
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "jobs-port");
  // Job A's losses when it runs alone (seed 1).
  std::string alone = out + "/alone.jsonl";
  RunResult solo = piperRun(
      {out, "--nproc", "2", "--steps", "3", "--seed", "1", "--metrics", alone});
  INFO("solo stderr: " << solo.err);
  REQUIRE(solo.exitCode() == 0);

  // Job A (seed 1) and job B (seed 2), started by hand on one port with no
  // launcher job id: A's rank 0 serves the store, B's rank 1 comes before
  // A's rank 1.
  int port = freePort();
  std::string where = "127.0.0.1:" + std::to_string(port);
  std::string metrics = out + "/a.jsonl";
  auto args = [&](const char *seed) {
    return std::vector<std::string>{out,      "--steps",     "3",
                                    "--seed", seed,          "--metrics",
                                    metrics,  "--timeout-s", "30"};
  };
  Started a0 = startRun(args("1"), torchrunEnv(0, 2, port));
  Started b1 = startRun(args("2"), torchrunEnv(1, 2, port));
  RunResult b = finish(b1, std::chrono::seconds(60));
  // Then 1,000 strangers hold connections to the port without a hello (a
  // tenth of them half a hello), and A's rank 1 comes with --timeout-s 8:
  // a store that lets them keep it out until their hello deadline (10 s in
  // the store before this one) fails it.
  rlimit nofile = {};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &nofile) == 0);
  rlimit raised = nofile;
  raised.rlim_cur = std::max<rlim_t>(raised.rlim_cur,
                                     std::min<rlim_t>(raised.rlim_max, 2048));
  ::setrlimit(RLIMIT_NOFILE, &raised);
  std::vector<int> flood = strangers(port, 1000);
  ::setrlimit(RLIMIT_NOFILE, &nofile);
  CHECK(flood.size() == 1000);
  std::vector<std::string> shortWait = args("1");
  shortWait.back() = "8";
  Started a1 = startRun(shortWait, torchrunEnv(1, 2, port));
  RunResult ra1 = finish(a1, std::chrono::seconds(60));
  RunResult ra0 = finish(a0, std::chrono::seconds(60));
  for (int fd : flood)
    ::close(fd);
  INFO("job B rank 1 stderr: " << b.err << "\njob A rank 0 stderr: " << ra0.err
                               << "\njob A rank 1 stderr: " << ra1.err);
  CHECK(b.exitCode() == 1);
  std::regex refused(
      "piper-run: rank 1: the rendezvous store at " + where +
      " refused rank 1: rank 1 is of job 'torchrun/([0-9a-f]{16})', but this "
      "store serves job 'torchrun/([0-9a-f]{16})' \\(another job on this "
      "port\\? [^\n]*\\)\n");
  std::smatch ids;
  CHECK(std::regex_search(b.err, ids, refused));
  if (ids.size() == 3)
    CHECK(ids[1] != ids[2]);
  // Rank 0 logs the stranger it refused.
  CHECK(ra0.err.find("piper-run: rank 0: rendezvous store: refused a "
                     "connection from 127.0.0.1:") != std::string::npos);
  CHECK(ra0.err.find(": rank 1 is of job 'torchrun/") != std::string::npos);
  // Job A trained with its own rank 1: the losses of A alone.
  CHECK(ra0.exitCode() == 0);
  CHECK(ra1.exitCode() == 0);
  CHECK(readFile(metrics).size() > 0);
  CHECK(metricLosses(metrics) == metricLosses(alone));
}

TEST_CASE("two jobs on one --checkpoint-dir: the second is refused at start, "
          "the first keeps going",
          "[launcher][jobs]") {
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "jobs-ckpt");
  std::string ckpt = out + "/ckpt";
  Started a =
      startRun({out, "--nproc", "2", "--steps", "100000000", "--checkpoint-dir",
                ckpt, "--checkpoint-every", "5", "--log-every", "100000000"},
               {});
  REQUIRE(
      waitFor([&] { return newestStep(ckpt) >= 5; }, std::chrono::seconds(60)));
  std::string inUse = "--checkpoint-dir '" + ckpt +
                      "' is in use by another job: job 'piper-run:local-";
  std::string holder = "(pid " + std::to_string(a.pid) + " on host '";

  // A second local job stops before any rank starts.
  RunResult b = piperRun({out, "--nproc", "2", "--steps", "3",
                          "--checkpoint-dir", ckpt, "--checkpoint-every", "1"},
                         {}, std::chrono::seconds(60));
  INFO("second job stderr: " << b.err);
  CHECK(b.exitCode() == 1);
  CHECK(b.err.rfind("piper-run: " + inUse, 0) == 0);
  CHECK(b.err.find(holder) != std::string::npos);
  CHECK(b.err.find("holds its lock '" + ckpt + "/.piper-run.lock'") !=
        std::string::npos);
  // A third, under torchrun-style variables: its rank 0 stops before the
  // rendezvous.
  RunResult c =
      piperRun({out, "--steps", "3", "--checkpoint-dir", ckpt, "--resume",
                "--timeout-s", "20"},
               torchrunEnv(0, 2, freePort()), std::chrono::seconds(60));
  INFO("third job stderr: " << c.err);
  CHECK(c.exitCode() == 1);
  CHECK(c.err.rfind("piper-run: rank 0: " + inUse, 0) == 0);
  CHECK(c.seconds < 15);

  // The first job is still running and still writing checkpoints.
  int status = 0;
  CHECK(::waitpid(a.pid, &status, WNOHANG) == 0);
  int seen = newestStep(ckpt);
  CHECK(waitFor([&] { return newestStep(ckpt) > seen; },
                std::chrono::seconds(60)));
  ::kill(a.pid, SIGINT);
  RunResult ra = finish(a, std::chrono::seconds(60));
  INFO("first job stderr (tail): "
       << ra.err.substr(ra.err.size() > 2000 ? ra.err.size() - 2000 : 0));
  CHECK(ra.exitCode() == 128 + SIGINT);
  CHECK(ra.err.find("is in use by another job") == std::string::npos);

  // Once it has ended, the directory is free for the next job.
  RunResult d = piperRun({out, "--nproc", "2", "--steps", "1",
                          "--checkpoint-dir", ckpt, "--checkpoint-every", "1"},
                         {}, std::chrono::seconds(60));
  INFO("next job stderr: " << d.err);
  CHECK(d.exitCode() == 0);
}

TEST_CASE("the checkpoint directory's lock lets a job's own restarts and "
          "spares in",
          "[launcher][jobs]") {
  TinyModel m;
  std::string out = strategy(pipelinePlans(m, 2), "jobs-restart");
  // Rank 0 crashes in step 3 of the first attempt; rank 0 of the restart,
  // or the spare that takes its place, must not be locked out by its own
  // launcher.
  std::vector<std::string> fault = {
      "PIPER_FAULT=rank=0,step=3,action=crash,attempt=0"};
  for (const char *how : {"--max-restarts", "--standby"}) {
    std::string ckpt = out + "/ckpt" + how;
    RunResult r =
        piperRun({out, "--nproc", "2", "--steps", "4", "--checkpoint-dir", ckpt,
                  "--checkpoint-every", "1", how, "1"},
                 fault, std::chrono::seconds(90));
    INFO(how << " stderr: " << r.err);
    CHECK(r.exitCode() == 0);
    CHECK(r.err.find(std::string(how) == "--standby"
                         ? "rank 0 replaced by standby 0"
                         : "restart 1 of 1") != std::string::npos);
    CHECK(r.err.find("is in use by another job") == std::string::npos);
    CHECK(newestStep(ckpt) == 4);
  }
}
