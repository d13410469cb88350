// The watchdog end to end: a 2-stage pipeline (ranks 0 and 1) where rank 1
// crashes, stalls or hangs in a communication (PIPER_FAULT), or is killed
// (SIGKILL) or stopped (SIGSTOP) from outside, or its (emulated) GPU fails
// an operation. Every rank must stop within --timeout-s + 5 s, the failed
// rank must be named, and every rank's last plan position printed with its
// label. Also PIPER_FAULT's errors.
#include <dirent.h>

#include <filesystem>

#include "runtime/launch/launcher_test_util.h"
#include "runtime/launch/watchdog/Watchdog.h"

using namespace piper::launchertest;
using piper::runtime::FaultSpec;
using piper::runtime::parseFault;

namespace {

constexpr int kTimeoutS = 3;

/// The pid of the child of `parent` whose environment has PIPER_RANK=rank,
/// or -1.
pid_t rankPid(pid_t parent, int rank) {
  DIR *proc = ::opendir("/proc");
  if (!proc)
    return -1;
  pid_t found = -1;
  while (dirent *e = ::readdir(proc)) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0)
      continue;
    std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
    size_t close = stat.rfind(')');
    if (close == std::string::npos)
      continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2 ||
        ppid != parent)
      continue;
    std::string env = readFile("/proc/" + std::to_string(pid) + "/environ");
    std::string want = "PIPER_RANK=" + std::to_string(rank);
    for (size_t at = 0; at < env.size();) {
      size_t end = env.find('\0', at);
      if (end == std::string::npos)
        end = env.size();
      if (env.compare(at, end - at, want) == 0)
        found = pid;
      at = end + 1;
    }
  }
  ::closedir(proc);
  return found;
}

/// The number of complete lines of the file at `path`.
size_t completeLines(const std::string &path) {
  std::string text = readFile(path);
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

struct Launch {
  RunResult result;
  double faultToEnd = 0; // seconds from the fault to the launcher's exit
};

/// Runs the 2-rank pipeline `out` for many steps with `env` and the further
/// piper-run arguments `extra`; when `signal` is non-zero, sends it to rank
/// 1 once step 2 is in the metrics file.
Launch runPipeline(const std::string &out, const std::vector<std::string> &env,
                   int signal, const std::vector<std::string> &extra = {}) {
  std::string dir = tempDir("watch");
  std::string metrics = dir + "/metrics.jsonl";
  std::string outPath = dir + "/stdout", errPath = dir + "/stderr";
  std::vector<std::string> args = {out,
                                   "--nproc",
                                   "2",
                                   "--steps",
                                   "100000000",
                                   "--timeout-s",
                                   std::to_string(kTimeoutS),
                                   "--metrics",
                                   metrics};
  args.insert(args.end(), extra.begin(), extra.end());
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  pid_t pid = spawnBinary(kPiperRun, args, env, outPath, errPath);
  Launch l;
  Clock::time_point faultAt{};
  bool signalled = false;
  while (true) {
    pid_t done = ::waitpid(pid, &l.result.status, WNOHANG);
    if (done == pid)
      break;
    auto now = Clock::now();
    if (now - start > std::chrono::seconds(40)) {
      l.result.timedOut = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &l.result.status, 0);
      break;
    }
    if (signal && !signalled && completeLines(metrics) >= 2) {
      // Rank 1's heartbeat shows a step by now.
      std::this_thread::sleep_for(std::chrono::milliseconds(700));
      pid_t victim = rankPid(pid, 1);
      REQUIRE(victim > 0);
      REQUIRE(::kill(victim, signal) == 0);
      signalled = true;
      faultAt = Clock::now();
    }
    if (!signal && !signalled &&
        readFile(errPath).find("PIPER_FAULT: ") != std::string::npos) {
      signalled = true;
      faultAt = Clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto end = Clock::now();
  l.result.seconds = std::chrono::duration<double>(end - start).count();
  l.result.out = readFile(outPath);
  l.result.err = readFile(errPath);
  // A fault announces itself on stderr just before it acts; the launcher
  // exits after every rank.
  CHECK(signalled);
  l.faultToEnd = std::chrono::duration<double>(end - faultAt).count();
  return l;
}

/// The checks every failure shares: the run stopped in time, rank 1 is
/// named by the launcher and by rank 0's report, which shows both ranks'
/// positions with their labels.
void checkReport(const Launch &l, const std::string &culpritStatus) {
  const RunResult &r = l.result;
  INFO("stderr: " << r.err);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode() == 1);
  CHECK(r.err.find("piper-run: rank 1 failed (" + culpritStatus) !=
        std::string::npos);
  CHECK(r.err.find("piper-run: rank 0: watchdog: rank 1 failed") !=
        std::string::npos);
  CHECK(r.err.find("piper-run: rank 0: last plan positions:") !=
        std::string::npos);
  // Both ranks' positions, rank 1's from after step 1 began.
  CHECK(std::regex_search(
      r.err, std::regex(R"(  rank 0 \(this rank\): step [1-9][0-9]*, \w+, )"
                        R"(no progress for [0-9.]+ s\n    stream 'main')")));
  CHECK(std::regex_search(
      r.err, std::regex(R"(  rank 1: step [1-9][0-9]*, \w+, no (heartbeat|)"
                        R"(progress) for [0-9.]+ s  <-- failed\n    )"
                        R"(stream 'main')")));
  CHECK(r.err.find("piper-run: rank 0 stopped because rank 1 failed (exit "
                   "code 4)") != std::string::npos);
  CHECK(l.faultToEnd < kTimeoutS + 5);
  std::printf("watchdog_test: %s: stopped %.2f s after the fault\n",
              culpritStatus.c_str(), l.faultToEnd);
}

std::string pipeline() {
  TinyModel m;
  return strategy(pipelinePlans(m, 2), "watch-pp2");
}

} // namespace

TEST_CASE("PIPER_FAULT syntax", "[watchdog]") {
  FaultSpec f;
  REQUIRE(parseFault("rank=1,step=2,stream=main,inst=5,action=hang_comm", f));
  CHECK(f.rank == 1);
  CHECK(f.step == 2);
  CHECK(f.stream == "main");
  CHECK(f.instruction == 5);
  CHECK(f.action == FaultSpec::kHangComm);
  REQUIRE(parseFault("action=stall,rank=0", f));
  CHECK(f.step == 1);
  CHECK(f.instruction == 0);
  CHECK(f.stream.empty());
  CHECK(f.action == FaultSpec::kStall);
  CHECK(f.attempt == -1);
  REQUIRE(parseFault("rank=0,action=crash,attempt=0", f));
  CHECK(f.attempt == 0);
  REQUIRE(parseFault("rank=1,action=hang_inside,inst=3", f));
  CHECK(f.action == FaultSpec::kHangInside);
  REQUIRE(parseFault("rank=1,action=device_error,step=2,inst=2", f));
  CHECK(f.action == FaultSpec::kDeviceError);
  CHECK_FALSE(f.atCheckpoint);
  REQUIRE(parseFault("rank=0,action=stall,step=3,at=checkpoint", f));
  CHECK(f.atCheckpoint);
  CHECK(f.step == 3);
  REQUIRE(parseFault("rank=0,action=crash,at=step", f));
  CHECK_FALSE(f.atCheckpoint);
  REQUIRE(parseFault("rank=1,action=hang_data,step=4", f));
  CHECK(f.action == FaultSpec::kHangData);
  CHECK(f.step == 4);
  for (const char *bad :
       {"rank=1,action=hang_data,inst=2", "rank=1,action=hang_data,stream=main",
        "rank=1,action=hang_data,at=checkpoint"}) {
    INFO(bad);
    piper::Status st = parseFault(bad, f);
    REQUIRE_FALSE(st);
    CHECK(st.message().find("hang_data takes no stream, inst or at") !=
          std::string::npos);
  }
  for (const char *bad :
       {"", "rank=1", "action=crash", "rank=x,action=crash",
        "rank=1,action=explode", "rank=1,action=crash,step=0",
        "rank=1,action=crash,color=red", "rank=1,action=crash,rank=2",
        "rank=1,action=crash,inst", "rank=-1,action=crash",
        "rank=1,action=crash,attempt=-1", "rank=0,action=crash,at=end",
        "rank=0,action=hang_comm,at=checkpoint",
        "rank=0,action=crash,at=checkpoint,inst=2",
        "rank=0,action=crash,at=checkpoint,stream=main"}) {
    INFO(bad);
    piper::Status st = parseFault(bad, f);
    CHECK_FALSE(st);
    if (!st)
      CHECK(st.message().find("PIPER_FAULT=") != std::string::npos);
  }
}

TEST_CASE("piper-run refuses a bad PIPER_FAULT before starting ranks",
          "[watchdog]") {
  std::string out = pipeline();
  RunResult r = piperRun({out, "--nproc", "2"}, {"PIPER_FAULT=rank=1,oops"});
  CHECK(r.exitCode() == 2);
  CHECK(r.err.find("piper-run: PIPER_FAULT='rank=1,oops': 'oops' is not "
                   "key=value") != std::string::npos);
  r = piperRun({out, "--nproc", "2"}, {"PIPER_FAULT=rank=2,action=crash"});
  CHECK(r.exitCode() == 2);
  CHECK(r.err.find("PIPER_FAULT: rank 2 is not one of the 2 ranks") !=
        std::string::npos);
  // Plan-level errors come from the rank the fault names.
  r = piperRun({out, "--nproc", "2"},
               {"PIPER_FAULT=rank=1,stream=side,action=crash"});
  CHECK(r.exitCode() == 1);
  CHECK(r.err.find("PIPER_FAULT: rank 1's plan has no stream 'side' (it has "
                   "'main')") != std::string::npos);
  r = piperRun({out, "--nproc", "2"},
               {"PIPER_FAULT=rank=1,inst=2,action=hang_comm"});
  CHECK(r.exitCode() == 1);
  CHECK(r.err.find("hang_comm needs a communication instruction; instruction "
                   "2 of stream 'main' on rank 1 is CALL 'F PP=1 MB=0'") !=
        std::string::npos);
  r = piperRun({out, "--nproc", "2"},
               {"PIPER_FAULT=rank=1,inst=2,action=hang_inside"});
  CHECK(r.exitCode() == 1);
  CHECK(r.err.find("hang_inside needs a communication instruction; "
                   "instruction 2 of stream 'main' on rank 1 is CALL 'F PP=1 "
                   "MB=0'") != std::string::npos);
  // Only the emulated GPU can be told to fail.
  r = piperRun({out, "--nproc", "2"},
               {"PIPER_FAULT=rank=1,inst=2,action=device_error"});
  CHECK(r.exitCode() == 1);
  CHECK(r.err.find("PIPER_FAULT: device_error needs --backend cuda-emulation "
                   "(rank 1 runs on 'cpu')") != std::string::npos);
}

TEST_CASE("piper-run refuses an at=checkpoint fault that no checkpoint meets",
          "[watchdog]") {
  std::string out = pipeline();
  RunResult r = piperRun({out, "--nproc", "2"},
                         {"PIPER_FAULT=rank=0,step=2,action=crash,at="
                          "checkpoint"});
  CHECK(r.exitCode() == 2);
  CHECK(r.err.find("piper-run: PIPER_FAULT: at=checkpoint, step 2: no "
                   "checkpoint is written after step 2 (--checkpoint-every "
                   "0)") != std::string::npos);
  r = piperRun({out, "--nproc", "2", "--checkpoint-dir",
                tempDir("watch-ck-every"), "--checkpoint-every", "3"},
               {"PIPER_FAULT=rank=0,step=2,action=crash,at=checkpoint"});
  CHECK(r.exitCode() == 2);
  CHECK(r.err.find("(--checkpoint-every 3)") != std::string::npos);
}

// Rank 0 (which also merges the checkpoint and writes its state.json) dies
// or stops inside the checkpoint after step 2, its files written, while
// rank 1 waits at the barrier that completes it (issue 42 item 12): every
// report names rank 0, shows both ranks in that checkpoint, and the
// incomplete checkpoint is not taken for a complete one.
TEST_CASE("watchdog: rank 0 failing inside a checkpoint write is named",
          "[watchdog]") {
  for (const char *action : {"crash", "stall"}) {
    std::string dir = tempDir("watch-ck");
    Launch l = runPipeline(
        pipeline(),
        {std::string("PIPER_FAULT=rank=0,step=2,at=checkpoint,action=") +
         action},
        0, {"--checkpoint-dir", dir, "--checkpoint-every", "1"});
    const RunResult &r = l.result;
    INFO(action << ": stderr: " << r.err);
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.exitCode() == 1);
    CHECK(r.err.find("PIPER_FAULT: " +
                     std::string(action[0] == 'c' ? "crashing (SIGKILL)"
                                                  : "stalling (SIGSTOP)") +
                     " at the checkpoint of step 2, its files written") !=
          std::string::npos);
    CHECK(r.err.find("piper-run: rank 0 failed (") != std::string::npos);
    CHECK(r.err.find("piper-run: rank 1: watchdog: rank 0 failed") !=
          std::string::npos);
    CHECK(r.err.find("watchdog: rank 1 failed") == std::string::npos);
    CHECK(r.err.find("piper-run: rank 1 stopped because rank 0 failed (exit "
                     "code 4)") != std::string::npos);
    CHECK(std::regex_search(
        r.err,
        std::regex(R"(  rank 0: step 2, run, no (heartbeat|progress) )"
                   R"(for [0-9.]+ s  <-- failed\n    checkpoint step 2: )"
                   R"(with all 2 ranks\n)")));
    CHECK(
        r.err.find("checkpoint step 2: with all 2 ranks\n    stream 'main'") !=
        std::string::npos);
    CHECK(l.faultToEnd < kTimeoutS + 5);
    // Step 1's checkpoint is complete, step 2's is not.
    CHECK(std::filesystem::exists(dir + "/step-1/state.json"));
    CHECK_FALSE(std::filesystem::exists(dir + "/step-2"));
  }
}

TEST_CASE("watchdog: PIPER_FAULT crash", "[watchdog]") {
  Launch l = runPipeline(pipeline(),
                         {"PIPER_FAULT=rank=1,step=2,inst=3,action=crash"}, 0);
  CHECK(l.result.err.find("PIPER_FAULT: crashing (SIGKILL) at step 2, stream "
                          "'main', instruction 3 (CALL 'B PP=1 MB=0')") !=
        std::string::npos);
  checkReport(l, "killed by signal 9");
  CHECK(l.result.err.find("  rank 1: step 2, run, no progress for ") !=
        std::string::npos);
  CHECK(l.result.err.find("stream 'main' instruction 3 CALL 'B PP=1 MB=0': "
                          "segment 'bwd1'") != std::string::npos);
}

TEST_CASE("watchdog: PIPER_FAULT stall", "[watchdog]") {
  Launch l = runPipeline(pipeline(),
                         {"PIPER_FAULT=rank=1,step=2,inst=2,action=stall"}, 0);
  checkReport(l, "watchdog: no heartbeat for");
  // The stalled rank was stopped where the fault put it.
  CHECK(l.result.err.find("stream 'main' instruction 2 CALL 'F PP=1 MB=0': "
                          "segment 'fwd1'") != std::string::npos);
  CHECK(l.faultToEnd > kTimeoutS - 1.5);
}

TEST_CASE("watchdog: PIPER_FAULT hang_comm", "[watchdog]") {
  Launch l = runPipeline(
      pipeline(), {"PIPER_FAULT=rank=1,step=2,inst=4,action=hang_comm"}, 0);
  // Rank 1 names itself and exits 1; rank 0 names rank 1 and exits 4.
  checkReport(l, "exit code 1");
  const std::string &err = l.result.err;
  CHECK(err.find("piper-run: rank 1: watchdog: rank 1 failed: stuck: "
                 "heartbeat alive, but no progress") != std::string::npos);
  CHECK(err.find("stream 'main' instruction 4 SEND 'send dx MB=0': to rank "
                 "0") != std::string::npos);
  CHECK(err.find("stream 'main' instruction 6 RECV 'recv dx MB=0': from "
                 "rank 1") != std::string::npos);
  CHECK(l.faultToEnd > kTimeoutS - 1.5);
}

// A data source that hangs (a dead network file system) while the batches
// of step 2 are filled, during step 1 (the batches are filled a step
// ahead): rank 1 finished step 1's instructions, so its report shows where
// it is stuck instead, and it is the culprit (rank 0 waits for it).
TEST_CASE("watchdog: PIPER_FAULT hang_data names the data source",
          "[watchdog]") {
  Launch l = runPipeline(pipeline(),
                         {"PIPER_FAULT=rank=1,step=2,action=hang_data"}, 0);
  checkReport(l, "exit code 1");
  const std::string &err = l.result.err;
  CHECK(err.find("PIPER_FAULT: hanging its data source (hang_data) at "
                 "filling the batches of step 2") != std::string::npos);
  CHECK(err.find("piper-run: rank 1: watchdog: rank 1 failed: stuck: "
                 "heartbeat alive, but no progress") != std::string::npos);
  CHECK(err.find("data: filling the batches of step 2 from the data source") !=
        std::string::npos);
  // Its finished stream waits for nothing: the data line says where it is.
  INFO(err);
  CHECK(err.find("after its last instruction (") != std::string::npos);
  CHECK(err.find("waiting for its sends") == std::string::npos);
  CHECK(l.faultToEnd > kTimeoutS - 1.5);
}

// A GPU's error (here the emulated GPU's, told to fail its next operation)
// is no crash: it comes back as a Status through the executor, so the rank
// fails with a message naming its stream, instruction, segment and the
// operation, its watchdog publishes that as the verdict, and rank 0 stops
// because rank 1 failed.
TEST_CASE("watchdog: a device error on rank 1 is its named failure",
          "[watchdog]") {
  Launch l = runPipeline(
      pipeline(), {"PIPER_FAULT=rank=1,step=2,inst=2,action=device_error"}, 0,
      {"--backend", "cuda-emulation"});
  const std::string &err = l.result.err;
  CHECK(err.find("PIPER_FAULT: failing the device's next operation "
                 "(device_error) at step 2, stream 'main', instruction 2 "
                 "(CALL 'F PP=1 MB=0')") != std::string::npos);
  checkReport(l, "exit code 1");
  // What failed, where: the rank's own error and both watchdogs' verdicts.
  const std::string failure =
      R"(rank 1, stream 'main', instruction 2 \(F PP=1 MB=0\): segment )"
      R"('fwd1', kernel 0: [^\n]*emulated device error \(PIPER_FAULT )"
      R"(action=device_error\))";
  CHECK(std::regex_search(err, std::regex("piper-run: rank 1: watchdog: "
                                          "rank 1 failed: " +
                                          failure)));
  CHECK(std::regex_search(err, std::regex("piper-run: rank 0: watchdog: "
                                          "rank 1 failed: " +
                                          failure)));
  CHECK(std::regex_search(err, std::regex("\npiper-run: " + failure)));
  CHECK(err.find("CUDA error") == std::string::npos);
}

TEST_CASE("watchdog: a rank killed with SIGKILL", "[watchdog]") {
  Launch l = runPipeline(pipeline(), {}, SIGKILL);
  checkReport(l, "killed by signal 9");
}

TEST_CASE("watchdog: a rank stopped with SIGSTOP", "[watchdog]") {
  Launch l = runPipeline(pipeline(), {}, SIGSTOP);
  checkReport(l, "watchdog: no heartbeat for");
  CHECK(l.faultToEnd > kTimeoutS - 1.5);
}

// Data parallelism: a rank that reaches the gradient all-reduce but never
// begins it (hang_comm acts just before) looks, by position alone, like its
// partner, which is inside the all-reduce waiting for it. The heartbeat
// says which one began: the one that did not is named, whichever rank it
// is (by position alone, the longest stuck or the lowest rank was named).
TEST_CASE("watchdog: hang_comm at a data-parallel all-reduce names the rank "
          "that never arrived",
          "[watchdog]") {
  TinyModel m;
  // Instruction 3 of stream 'compute': the ALL_REDUCE of the gradients.
  std::string out = strategy({singleClassPlan(m, 1, {0, 1}, 2)}, "watch-dp2");
  for (int culprit : {0, 1}) {
    int other = 1 - culprit;
    Launch l = runPipeline(out,
                           {"PIPER_FAULT=rank=" + std::to_string(culprit) +
                            ",step=2,inst=3,action=hang_comm"},
                           0);
    const RunResult &r = l.result;
    INFO("culprit " << culprit << ", stderr: " << r.err);
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.exitCode() == 1);
    CHECK(r.err.find("piper-run: rank " + std::to_string(culprit) +
                     " failed (") != std::string::npos);
    CHECK(r.err.find("piper-run: rank " + std::to_string(other) +
                     " stopped because rank " + std::to_string(culprit) +
                     " failed (exit code 4)") != std::string::npos);
    CHECK(r.err.find("instruction 3 ALL_REDUCE 'allreduce grads': group 0 "
                     "[0,1] (not begun)") != std::string::npos);
    // Not a guess: the partner began the all-reduce, the culprit did not.
    CHECK(r.err.find("cannot be told") == std::string::npos);
    CHECK(l.faultToEnd < kTimeoutS + 5);
  }
}

// Two ranks inside one all-reduce, each waiting on the other (hang_inside:
// rank 1 began it, then its transport "died"): which one failed cannot be
// told from outside. The verdict says so, and --standby promotes no spare
// on a guess: the run ends, as without a spare.
TEST_CASE("watchdog: ranks waiting on each other inside an all-reduce are a "
          "guess, and no spare replaces the guessed rank",
          "[watchdog]") {
  TinyModel m;
  std::string out =
      strategy({singleClassPlan(m, 1, {0, 1}, 2)}, "watch-dp2-inside");
  Launch l =
      runPipeline(out, {"PIPER_FAULT=rank=1,step=2,inst=3,action=hang_inside"},
                  0, {"--standby", "1"});
  const RunResult &r = l.result;
  INFO("stderr: " << r.err);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode() == 1);
  CHECK(r.err.find("PIPER_FAULT: hanging inside (hang_inside) at step 2") !=
        std::string::npos);
  // Both began the all-reduce: neither is marked "(not begun)".
  CHECK(r.err.find("(not begun)") == std::string::npos);
  std::smatch named;
  REQUIRE(std::regex_search(
      r.err, named,
      std::regex(R"(piper-run: rank [01]: watchdog: rank ([01]) failed: )"
                 R"(stuck: [^\n]*so which one failed cannot be )"
                 R"(told: rank ([01]) is the one stuck longest, a guess)")));
  CHECK(named[1] == named[2]);
  CHECK(r.err.find("piper-run: --standby: no spare replaces rank " +
                   named[1].str() +
                   ": the watchdog could not tell which rank failed") !=
        std::string::npos);
  CHECK(r.err.find("replaced by standby") == std::string::npos);
  CHECK(r.err.find("no standby left") == std::string::npos);
  CHECK(l.faultToEnd < kTimeoutS + 5);
}

TEST_CASE("Abort encodes whether its culprit is a guess", "[watchdog]") {
  using piper::runtime::Abort;
  using piper::runtime::decodeAbort;
  using piper::runtime::encodeAbort;
  Abort a{3, "stuck", true}, b;
  REQUIRE(decodeAbort(encodeAbort(a), b));
  CHECK(b.culprit == 3);
  CHECK(b.guess);
  CHECK(b.reason == "stuck");
  Abort c{2, "no heartbeat", false}, d;
  REQUIRE(decodeAbort(encodeAbort(c), d));
  CHECK(d.culprit == 2);
  CHECK_FALSE(d.guess);
  CHECK_FALSE(decodeAbort("2 maybe\nx", d));
}
