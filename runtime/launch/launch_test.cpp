// Unit tests of piper-run's pieces that need no process of their own: the
// progress lines and summary, --metrics lines, the rank environment, the
// BLAS core choice and --trace's parts, merge and measured bubble.
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "proto/PlanFile.h"
#include "runtime/launch/BlasCore.h"
#include "runtime/launch/checkpoints/CheckpointLock.h"
#include "runtime/launch/rank/Progress.h"
#include "runtime/launch/rank/Reporting.h"
#include "runtime/launch/rank/Trace.h"
#include "runtime/launch/rendezvous/LaunchEnv.h"
#include "runtime/launch/rendezvous/Rendezvous.h"
#include "runtime/launch/rendezvous/TcpRendezvous.h"

using namespace piper;

using namespace piper::runtime;

TEST_CASE("metrics lines", "[launch]") {
  StepReport r;
  r.step = 3;
  r.loss = 2.901320343017578;
  r.tokensPerS = 15389.4567;
  r.stepSeconds = 0.0123456789;
  r.lr = 6e-4;
  r.gradNorm = 1.28591234567;
  r.peakBytes = 17356800;
  r.maxRssBytes = 35328000;
  CHECK(metricsLine(r) ==
        "{\"step\": 3, \"loss\": 2.901320343017578, \"tokens_per_s\": "
        "15389.457, \"step_time_s\": 0.012346, \"lr\": 0.0006, "
        "\"grad_norm\": 1.28591235, \"peak_bytes\": 17356800, "
        "\"max_rss_bytes\": 35328000}");
  // The loss reads back exactly.
  auto parsed = nlohmann::json::parse(metricsLine(r));
  CHECK(parsed["loss"].get<double>() == r.loss);

  // No clipping (no norm) and a diverged loss are null.
  r.gradNorm = -1;
  r.loss = std::nan("");
  parsed = nlohmann::json::parse(metricsLine(r));
  CHECK(parsed["loss"].is_null());
  CHECK(parsed["grad_norm"].is_null());
}

TEST_CASE("clock and byte formats", "[launch]") {
  CHECK(formatClock(0) == "0:00:00");
  CHECK(formatClock(0.4) == "0:00:00");
  CHECK(formatClock(59.6) == "0:01:00");
  CHECK(formatClock(3725) == "1:02:05");
  CHECK(formatClock(123 * 3600 + 4 * 60 + 5) == "123:04:05");
  CHECK(formatClock(-1) == "?");
  CHECK(formatClock(std::nan("")) == "?");
  CHECK(formatBytes(512) == "512 B");
  CHECK(formatBytes(17818) == "17.4 KiB");
  CHECK(formatBytes(17356800) == "16.6 MiB");
  CHECK(formatBytes(int64_t(3) << 40) == "3.0 TiB");
}

namespace {

/// A step of `seconds` with loss 2 and grad_norm 0.5.
StepReport stepOf(int64_t step, double seconds) {
  StepReport r;
  r.step = step;
  r.loss = 2;
  r.gradNorm = 0.5;
  r.stepSeconds = seconds;
  return r;
}

} // namespace

TEST_CASE("model FLOPs count each parameter once at its global shape",
          "[launch]") {
  // Two classes: a tied [4, 8] weight in both, an expert weight split over
  // 2 members ([2, 3, 5] of [4, 3, 5]) and a bias.
  std::vector<piper::plan::Plan> plans(2);
  auto param = [](piper::plan::Plan &p, const std::string &name,
                  std::vector<int64_t> shape, int members = 0) {
    piper::plan::Parameter *q = p.add_params();
    q->set_name(name);
    for (int64_t d : shape)
      q->mutable_type()->add_shape(d);
    if (members)
      q->set_expert_members(members);
  };
  param(plans[0], "wte", {4, 8});
  param(plans[1], "wte", {4, 8});
  param(plans[1], "experts.w1", {2, 3, 5}, 2);
  param(plans[1], "bias", {8});
  CHECK(modelFlopsPerStep(plans, 10) == 6.0 * (32 + 60 + 8) * 10);
}

TEST_CASE("progress lines: every --log-every steps and the last", "[launch]") {
  // Steps 1-5, 1000 tokens each; the first (warm-up) step is slow.
  Progress p(1, 5, 2, 1000);
  CHECK(p.record(stepOf(1, 4.0)) == "");
  // tokens/s and ms/step over steps 1-2; ETA: 3 steps left at the mean of
  // step 2 alone (the warm-up excluded).
  CHECK(p.record(stepOf(2, 1.0)) ==
        "step 2/5 | loss 2 | grad_norm 0.5 | 400 tokens/s | 2500.0 ms/step | "
        "ETA 0:00:03");
  CHECK(p.record(stepOf(3, 2.0)) == "");
  CHECK(p.record(stepOf(4, 2.0)) ==
        "step 4/5 | loss 2 | grad_norm 0.5 | 500 tokens/s | 2000.0 ms/step | "
        "ETA 0:00:02");
  // The last step is always printed, with ETA 0.
  StepReport last = stepOf(5, 1.0);
  last.loss = std::nan("");
  last.gradNorm = -1; // not measured: left out
  CHECK(p.record(last) ==
        "step 5/5 | loss nan | 1000 tokens/s | 1000.0 ms/step | ETA 0:00:00");

  CHECK(p.summary({17356800, 17818}, 10.04) ==
        "summary: 5 steps (steps 1-5) in 10.0 s wall time\n"
        "summary: mean 667 tokens/s, 1500.0 ms/step over steps 2-5 (first "
        "step excluded: warm-up)\n"
        "summary: peak arena memory per rank: rank 0 16.6 MiB, rank 1 17.4 "
        "KiB\n");
}

TEST_CASE("progress after --load, with MFU, and its summary", "[launch]") {
  // Resumed after step 2: steps 3-4; a step line for every step.
  Progress p(3, 4, 1, 1000);
  // 1e12 FLOPs per step on 1e13 FLOP/s of devices: 10% at 1 s/step.
  p.setFlops(1e12, 1e13);
  CHECK(p.record(stepOf(3, 1.0)) ==
        "step 3/4 | loss 2 | grad_norm 0.5 | 1000 tokens/s | 1000.0 ms/step | "
        "MFU 10.0% | ETA 0:00:01");
  CHECK(p.record(stepOf(4, 0.5)) ==
        "step 4/4 | loss 2 | grad_norm 0.5 | 2000 tokens/s | 500.0 ms/step | "
        "MFU 20.0% | ETA 0:00:00");
  std::vector<int64_t> peaks(16, 1 << 20);
  peaks[5] = 3 << 20;
  peaks[9] = 1 << 19;
  CHECK(p.summary(peaks, 75) ==
        "summary: 2 steps (steps 3-4) in 75.0 s wall time (0:01:15)\n"
        "summary: mean 2000 tokens/s, 500.0 ms/step, MFU 20.0% over step 4 "
        "(first step excluded: warm-up)\n"
        "summary: peak arena memory per rank: min 512.0 KiB (rank 9), max "
        "3.0 MiB (rank 5) over 16 ranks\n");

  // One step: the warm-up is all there is.
  Progress one(1, 1, 1, 1000);
  CHECK(one.record(stepOf(1, 2.0)) ==
        "step 1/1 | loss 2 | grad_norm 0.5 | 500 tokens/s | 2000.0 ms/step | "
        "ETA 0:00:00");
  CHECK(one.summary({}, 2) ==
        "summary: 1 step (step 1) in 2.0 s wall time\n"
        "summary: mean 500 tokens/s, 2000.0 ms/step over step 1 (the only "
        "step: warm-up included)\n");
  // No step ran (--steps 0): no summary.
  CHECK(Progress(1, 0, 1, 1000).summary({1}, 1) == "");
}

TEST_CASE("the environment of a spawned rank", "[launch]") {
  std::vector<std::string> env =
      rankEnvironment({"HOME=/root"}, 2, 4, "/tmp/store", 7);
  CHECK(env == std::vector<std::string>{
                   "HOME=/root", "PIPER_RANK=2", "PIPER_WORLD_SIZE=4",
                   "PIPER_STORE_DIR=/tmp/store", "PIPER_FAILURE_FD=7"});

  ::setenv("PIPER_RANK", "1", 1);
  ::setenv("PIPER_WORLD_SIZE", "2", 1);
  ::setenv("PIPER_STORE_DIR", "/tmp/s", 1);
  // A launcher never passes its own protocol variables on.
  for (const std::string &e : inheritedEnvironment(2))
    CHECK(e.rfind("PIPER_RANK=", 0) != 0);
  bool isRank = false;
  RankEnv rank;
  REQUIRE(readRankEnv(0, isRank, rank));
  CHECK(isRank);
  CHECK(rank.rank == 1);
  CHECK(rank.worldSize == 2);
  CHECK(rank.storeDir == "/tmp/s");
  CHECK(readRankEnv(3, isRank, rank).message() ==
        "--nproc is 3 but PIPER_WORLD_SIZE is 2");
  ::setenv("PIPER_RANK", "2", 1);
  CHECK(readRankEnv(0, isRank, rank).message() ==
        "PIPER_RANK 2 is out of range for PIPER_WORLD_SIZE 2");
  ::setenv("PIPER_RANK", "x", 1);
  CHECK(readRankEnv(0, isRank, rank).message() ==
        "PIPER_RANK='x' is not an integer");
  ::unsetenv("PIPER_RANK");
  REQUIRE(readRankEnv(0, isRank, rank));
  CHECK_FALSE(isRank);
  ::unsetenv("PIPER_WORLD_SIZE");
  ::unsetenv("PIPER_STORE_DIR");
}

TEST_CASE("the BLAS core for CPUs OpenBLAS does not recognise", "[launch]") {
  CHECK(fallbackBlasCore("Prescott", true, true) == "SkylakeX");
  CHECK(fallbackBlasCore("Prescott", false, true) == "Haswell");
  CHECK(fallbackBlasCore("Prescott", false, false) == "");
  CHECK(fallbackBlasCore("Cooperlake", true, true) == "");
  CHECK(fallbackBlasCore("Haswell", true, true) == "");
}

namespace {

/// An EnvLookup over `vars` ("NAME=value").
EnvLookup fakeEnv(std::vector<std::string> vars) {
  auto held = std::make_shared<std::vector<std::string>>(std::move(vars));
  return [held](const char *name) -> const char * {
    std::string prefix = std::string(name) + "=";
    for (const std::string &v : *held)
      if (v.rfind(prefix, 0) == 0)
        return v.c_str() + prefix.size();
    return nullptr;
  };
}

/// readRankEnv on `vars`; REQUIREs success.
RankEnv rankFrom(std::vector<std::string> vars, int nproc = 0) {
  bool isRank = false;
  RankEnv env;
  Status st = readRankEnv(nproc, fakeEnv(std::move(vars)), isRank, env);
  INFO(st.message());
  REQUIRE(st);
  REQUIRE(isRank);
  return env;
}

std::string rankError(std::vector<std::string> vars, int nproc = 0) {
  bool isRank = false;
  RankEnv env;
  return readRankEnv(nproc, fakeEnv(std::move(vars)), isRank, env).message();
}

} // namespace

TEST_CASE("Slurm host lists", "[launch]") {
  std::vector<std::string> hosts;
  REQUIRE(expandNodeList("node[01-04,07]", hosts));
  CHECK(hosts == std::vector<std::string>{"node01", "node02", "node03",
                                          "node04", "node07"});
  REQUIRE(expandNodeList("a1,gpu[9-10]-ib,rack[1-2]-n[3,5],solo", hosts));
  CHECK(hosts == std::vector<std::string>{"a1", "gpu9-ib", "gpu10-ib",
                                          "rack1-n3", "rack1-n5", "rack2-n3",
                                          "rack2-n5", "solo"});
  std::string first;
  REQUIRE(firstNodeListHost("node[01-04,07]", first));
  CHECK(first == "node01");
  REQUIRE(firstNodeListHost("rack[3-4]-node[007-100],x", first));
  CHECK(first == "rack3-node007");
  REQUIRE(firstNodeListHost("login2", first));
  CHECK(first == "login2");
  // A huge list is not expanded to find its first host.
  REQUIRE(firstNodeListHost("n[0-999999999999]", first));
  CHECK(first == "n0");
  CHECK(expandNodeList("n[0-999999999999]", hosts).message() ==
        "host list 'n[0-999999999999]': more than 100000 hosts");
  CHECK(expandNodeList("node[01-04", hosts).message() ==
        "host list 'node[01-04': unbalanced brackets");
  CHECK(expandNodeList("node[4-1]", hosts).message() ==
        "host list 'node[4-1]': the range '4-1' runs backwards");
  CHECK(expandNodeList("node[a-b]", hosts).message() ==
        "host list 'node[a-b]': 'a' is not a number in brackets");
  CHECK(expandNodeList("a,,b", hosts).message() ==
        "host list 'a,,b': an empty host");
}

TEST_CASE("rank and world from each launcher's variables", "[launch]") {
  // torchrun-style.
  RankEnv t = rankFrom({"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1",
                        "MASTER_ADDR=127.0.0.2", "MASTER_PORT=29400"});
  CHECK(t.launcher == "torchrun");
  CHECK(t.rank == 3);
  CHECK(t.worldSize == 4);
  CHECK(t.localRank == 1);
  CHECK(t.masterAddr == "127.0.0.2");
  CHECK(t.masterPort == 29400);
  CHECK(t.storeDir.empty());
  CHECK(t.localWorldSize == 0);
  CHECK(rankFrom({"RANK=3", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2",
                  "MASTER_ADDR=h", "MASTER_PORT=1"})
            .localWorldSize == 2);
  CHECK(rankError({"RANK=1", "WORLD_SIZE=2"}) ==
        "RANK and WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is not "
        "(rank 0's address and a free port on it)");
  CHECK(rankError({"RANK=0", "WORLD_SIZE=0"}) ==
        "WORLD_SIZE must be a positive number of ranks, not 0");
  CHECK(rankError(
            {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=70000"}) ==
        "MASTER_PORT=70000 is not a TCP port (1-65535)");
  CHECK(
      rankError({"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT="}) ==
      "MASTER_PORT is set but empty: give rank 0's free TCP port (1-65535), "
      "or unset it");
  CHECK(rankError({"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=1"},
                  4) == "--nproc is 4 but WORLD_SIZE is 2");

  // Slurm, inside an srun step: the master is the first host of the list,
  // the port comes from the job id unless MASTER_PORT says otherwise.
  std::vector<std::string> slurm = {
      "SLURM_PROCID=5",  "SLURM_NTASKS=8",
      "SLURM_LOCALID=1", "SLURM_JOB_ID=4242",
      "SLURM_STEP_ID=0", "SLURM_JOB_NODELIST=gpu[07-10],cpu1"};
  RankEnv s = rankFrom(slurm);
  CHECK(s.launcher == "slurm");
  CHECK(s.rank == 5);
  CHECK(s.worldSize == 8);
  CHECK(s.localRank == 1);
  CHECK(s.masterAddr == "gpu07");
  CHECK(s.masterPort >= 20000);
  CHECK(s.masterPort < 30000);
  CHECK(s.jobId == "4242.0");
  CHECK(s.localWorldSize == 0);
  slurm.push_back("SLURM_NTASKS_PER_NODE=4(x2)");
  CHECK(rankFrom(slurm).localWorldSize == 4);
  slurm.push_back("MASTER_PORT=1234");
  slurm.push_back("MASTER_ADDR=10.1.2.3");
  RankEnv s2 = rankFrom(slurm);
  CHECK(s2.masterPort == 1234);
  CHECK(s2.masterAddr == "10.1.2.3");
  // A batch script (no srun step) is not a rank: piper-run launches there.
  bool isRank = true;
  RankEnv none;
  REQUIRE(readRankEnv(
      2, fakeEnv({"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=n1"}),
      isRank, none));
  CHECK_FALSE(isRank);
  // `srun -n 1 piper-run out/ --nproc 4`: the one task spawns its ranks.
  REQUIRE(readRankEnv(4,
                      fakeEnv({"SLURM_PROCID=0", "SLURM_NTASKS=1",
                               "SLURM_STEP_ID=0", "SLURM_JOB_NODELIST=n1"}),
                      isRank, none));
  CHECK_FALSE(isRank);

  // Open MPI on one machine: loopback, a port from the job id.
  RankEnv m =
      rankFrom({"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4",
                "OMPI_COMM_WORLD_LOCAL_RANK=2", "OMPI_COMM_WORLD_LOCAL_SIZE=4",
                "OMPI_MCA_ess_base_jobid=123456"});
  CHECK(m.launcher == "openmpi");
  CHECK(m.rank == 2);
  CHECK(m.localRank == 2);
  CHECK(m.masterAddr == "127.0.0.1");
  CHECK(m.jobId == "123456");
  CHECK(m.localWorldSize == 4);
  CHECK(rankError({"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4",
                   "OMPI_COMM_WORLD_LOCAL_SIZE=2"}) ==
        "under mpirun across machines, MASTER_ADDR must name an address of "
        "rank 0's machine (mpirun -x MASTER_ADDR=...)");

  // The order: piper-run's spawner, torchrun, Slurm, Open MPI.
  CHECK(rankFrom({"PIPER_RANK=0", "PIPER_WORLD_SIZE=2", "PIPER_STORE_DIR=/s",
                  "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=1"})
            .launcher == "piper-run");
  CHECK(rankFrom({"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=1",
                  "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2"})
            .launcher == "torchrun");
  CHECK(rankFrom({"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_STEP_ID=3",
                  "SLURM_NODELIST=a", "OMPI_COMM_WORLD_RANK=0",
                  "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2"})
            .launcher == "slurm");
  CHECK(rankError({"PIPER_RANK=0", "PIPER_WORLD_SIZE=0"}) ==
        "PIPER_WORLD_SIZE must be a positive number of ranks, not 0");
}

TEST_CASE("Gloo binds the address on the way to the master", "[launch]") {
  ::unsetenv("PIPER_HOST_ADDR");
  std::string address;
  // The master's own address when this machine has it: loopback runs bind
  // loopback, never every interface.
  REQUIRE(localAddressFor("127.0.0.1", address));
  CHECK(address == "127.0.0.1");
  address.clear();
  REQUIRE(localAddressFor("127.0.0.3", address));
  CHECK(address == "127.0.0.3");
  address.clear();
  REQUIRE(localAddressFor("localhost", address));
  CHECK((address == "127.0.0.1" || address == "::1"));
  // PIPER_HOST_ADDR names this node's address when the master is elsewhere.
  ::setenv("PIPER_HOST_ADDR", "127.0.0.5", 1);
  address.clear();
  REQUIRE(localAddressFor("127.0.0.2", address));
  CHECK(address == "127.0.0.5");
  ::unsetenv("PIPER_HOST_ADDR");
}

TEST_CASE("the job id: PIPER_JOB_ID, else the launcher's", "[launch]") {
  std::vector<std::string> torchrun = {"RANK=1", "WORLD_SIZE=2",
                                       "MASTER_ADDR=h", "MASTER_PORT=1"};
  CHECK(jobName(rankFrom(torchrun)) == "torchrun");
  torchrun.push_back("TORCHELASTIC_RUN_ID=run7");
  CHECK(jobName(rankFrom(torchrun)) == "torchrun:run7");
  torchrun.push_back("PIPER_JOB_ID=job-a");
  CHECK(jobName(rankFrom(torchrun)) == "torchrun:job-a");
  CHECK(jobName(rankFrom({"SLURM_PROCID=0", "SLURM_NTASKS=2",
                          "SLURM_JOB_ID=4242", "SLURM_STEP_ID=3",
                          "SLURM_JOB_NODELIST=n1"})) == "slurm:4242.3");
  // The older name still counts; PIPER_JOB_ID wins.
  CHECK(rankFrom({"PIPER_RANK=0", "PIPER_WORLD_SIZE=1", "PIPER_JOB_TOKEN=t"})
            .jobId == "t");
  CHECK(rankFrom({"PIPER_RANK=0", "PIPER_WORLD_SIZE=1", "PIPER_JOB_TOKEN=t",
                  "PIPER_JOB_ID=i"})
            .jobId == "i");
  CHECK(rankError(
            {"PIPER_RANK=0", "PIPER_WORLD_SIZE=1", "PIPER_JOB_ID=two words"}) ==
        "PIPER_JOB_ID 'two words' is not a job id: at most 256 printable "
        "characters without spaces or quotes");
  CHECK(rankError({"PIPER_RANK=0", "PIPER_WORLD_SIZE=1",
                   "PIPER_JOB_ID=" + std::string(300, 'x')})
            .find("is not a job id") != std::string::npos);
}

TEST_CASE("the job identity tells jobs, strategies and run options apart",
          "[launch]") {
  // A strategy of two classes on disk: the fingerprint reads the plan
  // files' headers.
  char tmpl[] = "/tmp/job-id-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  std::string dir = tmpl;
  piper::plan::Manifest manifest;
  manifest.set_world_size(2);
  for (int c = 0; c < 2; ++c) {
    auto *cls = manifest.add_classes();
    cls->set_device_class(c);
    cls->add_ranks(c);
    cls->set_plan_file("plan_class" + std::to_string(c) + ".pb");
    piper::plan::Plan plan;
    plan.set_device_class(c);
    REQUIRE(piper::plan::writePlanFile(dir + "/" + cls->plan_file(), plan) ==
            "");
  }
  RunOptions options;
  options.outDir = dir;
  auto fingerprint = [&](const RunOptions &o) {
    std::string f;
    Status st = runFingerprint(o, manifest, f);
    INFO(st.message());
    REQUIRE(st);
    CHECK(f.size() == 16);
    return f;
  };
  std::string base = fingerprint(options);
  CHECK(fingerprint(options) == base);
  RunOptions other = options;
  other.seed = 1;
  CHECK(fingerprint(other) != base);
  other = options;
  other.steps = 7;
  CHECK(fingerprint(other) != base);
  other = options;
  other.resume = true;
  CHECK(fingerprint(other) != base);
  // Another compile: a plan of other bytes.
  piper::plan::Plan changed;
  changed.set_device_class(1);
  changed.set_num_events(3);
  REQUIRE(piper::plan::writePlanFile(dir + "/plan_class1.pb", changed) == "");
  CHECK(fingerprint(options) != base);
  ::unlink((dir + "/plan_class1.pb").c_str());
  std::string missing;
  CHECK(runFingerprint(options, manifest, missing).message() ==
        "cannot read the header of plan file '" + dir +
            "/plan_class1.pb' (for the job id)");

  RankEnv env;
  env.launcher = "slurm";
  env.jobId = "77.0";
  CHECK(jobIdentity(env, base) == "slurm:77.0/" + base);
}

TEST_CASE("one job at a time in a checkpoint directory", "[launch]") {
  char tmpl[] = "/tmp/ckpt-lock-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  std::string dir = std::string(tmpl) + "/ckpt";
  std::unique_ptr<CheckpointDirLock> first;
  REQUIRE(CheckpointDirLock::acquire(dir, "piper-run:job-a", first));
  REQUIRE(first);
  // Another job (here: this process again, through another open file) is
  // refused with the holder's record.
  std::unique_ptr<CheckpointDirLock> second;
  Status st = CheckpointDirLock::acquire(dir, "piper-run:job-b", second);
  CHECK_FALSE(st);
  CHECK_FALSE(second);
  CHECK(st.message().rfind("--checkpoint-dir '" + dir +
                               "' is in use by another job: job "
                               "'piper-run:job-a' (pid " +
                               std::to_string(::getpid()) + " on host '",
                           0) == 0);
  CHECK(st.message().find("holds its lock '" + dir +
                          "/.piper-run.lock' (two jobs writing one "
                          "checkpoint directory remove each other's "
                          "checkpoints: wait for that job to end, or give "
                          "this one another --checkpoint-dir)") !=
        std::string::npos);
  // A child of the holder (a rank of the local launcher) is let in, and does
  // not take the lock itself.
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::unique_ptr<CheckpointDirLock> mine;
    Status childSt = CheckpointDirLock::acquire(dir, "piper-run:job-a", mine);
    ::_exit(!childSt ? 1 : mine ? 2 : 0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // Once the holder is gone, the next job gets it.
  first.reset();
  REQUIRE(CheckpointDirLock::acquire(dir, "piper-run:job-b", second));
  CHECK(second);
}

namespace {

/// A plan of two streams: "compute" runs CALL, CALL, and "comm" a SEND.
piper::plan::Plan tracePlan(int deviceClass) {
  piper::plan::Plan plan;
  plan.set_device_class(deviceClass);
  auto *compute = plan.add_streams();
  compute->set_name("compute");
  for (const char *label : {"task @stage0_F (PP=0 MB=0 PASS=F)", ""}) {
    auto *i = compute->add_instructions();
    i->set_kind(piper::plan::Instruction::CALL);
    i->set_label(label);
  }
  auto *comm = plan.add_streams();
  comm->set_name("comm");
  auto *send = comm->add_instructions();
  send->set_kind(piper::plan::Instruction::SEND);
  send->set_label("send channel 0");
  return plan;
}

/// A trace of tracePlan starting at `start` ns: the calls at [start+10,
/// start+40] and [start+30, start+60] (overlapping: a union of 50 ns), the
/// send at [start+50, start+90], the step ending at start+100.
StepTrace traceAt(int64_t start) {
  StepTrace t;
  t.step = 3;
  t.startNs = start;
  t.endNs = start + 100;
  t.streams = {{{start + 10, start + 40}, {start + 30, start + 60}},
               {{start + 50, start + 90}}};
  return t;
}

} // namespace

TEST_CASE("the measured bubble is the step's share without a CALL",
          "[launch][trace]") {
  MeasuredBubble b = measuredBubble(tracePlan(0), traceAt(1000));
  CHECK(b.stepSeconds == Approx(100e-9));
  CHECK(b.computeBusySeconds == Approx(50e-9));
  CHECK(b.fraction == Approx(0.5));
}

TEST_CASE("trace parts merge into one process per rank, aligned on one "
          "host's clock",
          "[launch][trace]") {
  std::vector<std::string> parts = {
      traceRankPart(tracePlan(0), 0, "h", traceAt(5000)),
      traceRankPart(tracePlan(1), 1, "h", traceAt(3000))};
  std::string text, summary;
  int64_t step = 0;
  REQUIRE(mergeTraceParts(parts, text, summary, step));
  CHECK(step == 3);
  auto trace = nlohmann::json::parse(text);
  CHECK(trace["metadata"]["source"] == "measured");
  CHECK(trace["metadata"]["bubble_fraction"] ==
        nlohmann::json::array({0.5, 0.5}));
  // Rank 1 started first: it is time 0, rank 0 two microseconds later.
  CHECK(trace["metadata"]["start_offset_us"] ==
        nlohmann::json::array({2.0, 0.0}));
  int x = 0;
  for (const auto &e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name")
      CHECK(e["args"]["name"] == "rank " + std::to_string(e["pid"].get<int>()));
    if (e["ph"] != "X")
      continue;
    ++x;
    if (e["pid"] == 0 && e["tid"] == 0 && e["args"]["instruction"] == 0) {
      CHECK(e["name"] == "task @stage0_F (PP=0 MB=0 PASS=F)");
      CHECK(e["ts"].get<double>() == Approx(2.01));
      CHECK(e["dur"].get<double>() == Approx(0.03));
    }
    if (e["args"]["instruction"] == 1 && e["tid"] == 0)
      CHECK(e["name"] == "CALL"); // no label: the kind
  }
  CHECK(x == 6);
  CHECK(summary.find("rank 1: step 0.000 ms, compute busy 0.000 ms, bubble "
                     "50.00%") != std::string::npos);

  // Two hosts: every rank at its own start.
  parts[1] = traceRankPart(tracePlan(1), 1, "other", traceAt(3000));
  REQUIRE(mergeTraceParts(parts, text, summary, step));
  CHECK(nlohmann::json::parse(text)["metadata"]["start_offset_us"] ==
        nlohmann::json::array({0.0, 0.0}));

  // A rank without its part: null entries, named in the summary.
  parts[1] = "";
  summary.clear();
  REQUIRE(mergeTraceParts(parts, text, summary, step));
  CHECK(
      nlohmann::json::parse(text)["metadata"]["bubble_fraction"][1].is_null());
  CHECK(summary.find("rank 1: not traced") != std::string::npos);

  // Different steps cannot be one trace.
  StepTrace other = traceAt(3000);
  other.step = 4;
  parts[1] = traceRankPart(tracePlan(1), 1, "h", other);
  Status st = mergeTraceParts(parts, text, summary, step);
  REQUIRE_FALSE(st);
  CHECK(st.message() == "the ranks traced different steps: 3 and 4 (rank 1)");

  // A part whose field has another type is an error naming it (it threw
  // nlohmann::json's type_error).
  auto bad =
      nlohmann::json::parse(traceRankPart(tracePlan(1), 1, "h", traceAt(3000)));
  bad["host"] = 7;
  parts[1] = bad.dump();
  st = mergeTraceParts(parts, text, summary, step);
  CHECK(st.message() == "the trace part of rank 1 is malformed: \"host\" is "
                        "a number, expected a string");
  bad["host"] = "h";
  bad["step"] = "3";
  parts[1] = bad.dump();
  st = mergeTraceParts(parts, text, summary, step);
  CHECK(st.message() == "the trace part of rank 1 is malformed: \"step\" is "
                        "a string, expected an integer");
  bad["step"] = 3;
  bad["events"] = {{{"ts", "soon"}}};
  parts[1] = bad.dump();
  st = mergeTraceParts(parts, text, summary, step);
  CHECK(st.message() == "the trace part of rank 1 is malformed: an event "
                        "without a numeric \"ts\"");
}
