// A rank's main, step by step (RankRun.h): load and check its plan, open the
// data and the state it starts from, create the communicator and executor;
// RankSteps.cpp runs the steps, reports and saves.
#include "runtime/launch/rank/RunRank.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <cblas.h>
#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "proto/PlanShards.h"
#include "runtime/formats/Integrity.h"
#include "runtime/launch/checkpoints/CheckpointIO.h"
#include "runtime/launch/checkpoints/StrategyFiles.h"
#include "runtime/launch/rank/RankRun.h"
#include "runtime/launch/rendezvous/LaunchEnv.h"
#include "support/AtomicFile.h"
#include "support/Errno.h"

namespace piper::runtime {

namespace {

/// The device class of the manifest that lists `rank`, or -1.
int classOf(const plan::Manifest &manifest, int rank) {
  for (int c = 0; c < manifest.classes_size(); ++c)
    for (int r : manifest.classes(c).ranks())
      if (r == rank)
        return c;
  return -1;
}

/// The step --trace records: --trace-step, else the last; an error when
/// --trace-step is not one of `first`..`last`, or the run has no step. A
/// resumed run with no step left (a restart after its last checkpoint)
/// traces none (`step` -1) instead.
Status chooseTracedStep(const RunOptions &options, bool continuing,
                        int64_t first, int64_t last, int64_t &step) {
  step = -1;
  if (last < first && continuing && options.traceStep == 0)
    return Status::ok();
  if (last < first)
    return Status::error(fmt::format(
        "--trace: this run has no step to trace (it ends at step {})", last));
  step = options.traceStep > 0 ? options.traceStep : last;
  if (step < first || step > last)
    return Status::error(fmt::format(
        "--trace-step {} is not a step of this run (it runs steps {} to {})",
        step, first, last));
  return Status::ok();
}

/// Whether PIPER_PROFILE asks for --profile (any value but empty or "0").
bool profileFromEnv() {
  const char *env = std::getenv("PIPER_PROFILE");
  return env && *env && std::strcmp(env, "0") != 0;
}

/// --profile=gpu or PIPER_PROFILE=gpu: device launches are timed.
bool profileGpu(const RunOptions &options) {
  const char *env = std::getenv("PIPER_PROFILE");
  return options.profileMode == "gpu" || (env && std::strcmp(env, "gpu") == 0);
}

/// How much longer than --timeout-s a communication may wait, so that the
/// watchdog (which acts at --timeout-s) names the culprit first.
constexpr std::chrono::milliseconds kCommTimeoutSlack{2000};

} // namespace

RankRun::RankRun(const RunOptions &options, const RankEnv &env,
                 const LoadedStrategy *loaded)
    : options(options), env(env), loaded(loaded), runStart(Clock::now()),
      rank(env.rank), who(fmt::format("rank {}", env.rank)) {}

void RankRun::check(const Status &st, bool named) {
  if (!st)
    exitRank(named ? who + ": " + st.message() : st.message());
}

Status RankRun::allPlans(std::vector<plan::Plan> &plans) {
  if (!loaded)
    return loadPlans(options, manifest, plans);
  plans = loaded->plans;
  return Status::ok();
}

int RankRun::run() {
  initFailureReport(rank);
  // The launcher stops ranks with SIGTERM; a user with ^C.
  removeTempFilesOnSignals();
  openLog();
  loadRankPlan();
  readFaults();
  openStartState();
  connect();
  createExecutor();
  startWatch();
  train();
  finish();
  return 0;
}

void RankRun::openLog() {
  // Under another launcher, --log-dir is this rank's own business (the
  // spawner opens the logs of its ranks itself).
  if (!options.logDir.empty() && env.launcher != "piper-run") {
    check(checkWritableDirectory(options.logDir,
                                 "--log-dir '" + options.logDir + "'"));
    std::string log = fmt::format("{}/rank-{}.log", options.logDir, rank);
    int fd =
        ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      exitRank(fmt::format("{}: --log-dir: cannot create '{}': {}", who, log,
                           errnoMessage(errno)));
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }

  // As piper-run's spawner does: N ranks of one machine share its cores
  // rather than each running a full-width BLAS pool, unless the user chose.
  if (env.launcher != "piper-run" && env.localWorldSize > 1 &&
      !std::getenv("OPENBLAS_NUM_THREADS") && !std::getenv("OMP_NUM_THREADS")) {
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    openblas_set_num_threads(
        static_cast<int>(std::max(1u, cores / unsigned(env.localWorldSize))));
  }
}

void RankRun::loadRankPlan() {
  if (loaded)
    manifest = loaded->manifest;
  else
    check(loadManifest(options, manifest));
  if (manifest.world_size() != env.worldSize)
    exitRank(fmt::format("{}: the strategy needs {} ranks, the {} world has "
                         "{}",
                         who, manifest.world_size(), env.launcher,
                         env.worldSize));
  cls = classOf(manifest, rank);
  if (cls < 0)
    exitRank(who + ": no device class of the manifest lists this rank");
  if (loaded)
    plan = loaded->plans.at(cls);
  else
    check(loadPlan(options, manifest, cls, plan));
}

void RankRun::readFaults() {
  // PIPER_FAULT (tests): checked on every rank, applied by the one it names.
  check(faultFromEnv(fault, faulty), /*named=*/false);
  if (faulty && fault.rank >= env.worldSize)
    exitRank(fmt::format("PIPER_FAULT: rank {} is not in the world of {} "
                         "ranks",
                         fault.rank, env.worldSize));
  // PIPER_ATTEMPT: which launch of the ranks this is (--max-restarts).
  long long attempt = 0;
  std::string attemptError;
  if (!envInt("PIPER_ATTEMPT", attempt, attemptError))
    attempt = 0;
  if (!attemptError.empty())
    exitRank(who + ": " + attemptError);
  if (faulty && fault.attempt >= 0 && fault.attempt != attempt)
    faulty = false;
  if (faulty)
    check(checkFaultCheckpoint(fault, options.checkpointEvery),
          /*named=*/false);
}

void RankRun::openStartState() {
  // One job at a time in a --checkpoint-dir: rank 0 holds the lock unless
  // the local launcher, its parent, does (CheckpointLock.h).
  if (rank == 0 && !options.checkpointDir.empty())
    check(CheckpointDirLock::acquire(options.checkpointDir, jobName(env),
                                     checkpointLock));

  if (loadsBatches(plan))
    check(openData(options, plan.training(), options.seed, data));

  // --load is checked against every class's parameters, so that a tensor
  // no class holds is an error here too when ranks are started by hand.
  if (!options.loadPath.empty() && isDirectory(options.loadPath)) {
    // A Hugging Face folder: a fresh run from its weights.
    std::vector<plan::Plan> plans;
    Status st = allPlans(plans);
    if (st)
      hfSource = HfStateSource::open(options.loadPath, manifest, plans, st);
    check(st);
  } else if (!options.loadPath.empty()) {
    std::vector<plan::Plan> plans;
    Status st = allPlans(plans);
    if (st)
      st = openCheckpoint(options.loadPath, plans, checkpoint, loadedStep);
    if (st)
      st = checkStepRange(options.loadPath, loadedStep, options.steps);
    // A run continued from a file piper wrote keeps its run id (and so
    // writes the same bytes, with --steps 0, as it read).
    if (st)
      st = recordedRunId(*checkpoint, runId);
    check(st);
  }
  // A generation after a failure under --standby: the state the launcher
  // chose (a surviving replica's), in place of --resume's checkpoint.
  const char *recoveryDir = std::getenv(kRecoveryDirVar);
  recovering = recoveryDir && *recoveryDir;
  if (recovering) {
    // The state of this rank's tensor-parallel member (the same slices).
    const auto &ranks = plan.ranks();
    const int64_t replica =
        std::find(ranks.begin(), ranks.end(), rank) - ranks.begin();
    check(openRecoveredState(recoveryDir, cls,
                             plan::tensorMember(plan, replica), recovered));
    loadedStep = recovered.step;
    runId = recovered.runId;
  }
  continuing = options.resume || recovering;
  // --resume: every rank finds the same checkpoint (nothing writes to
  // --checkpoint-dir before the first step, which all ranks take part in).
  identity = runIdentity(options, manifest, plan);
  if (options.resume && !recovering) {
    std::vector<plan::Plan> plans;
    Status st = allPlans(plans);
    if (st)
      st = findResumePoint(options.checkpointDir, plans, identity,
                           options.resumeFallback, resumePoint);
    check(st);
    loadedStep = resumePoint.step;
    if (!resumePoint.runId.empty())
      runId = resumePoint.runId;
    if (rank == 0) {
      for (const std::string &line : resumePoint.skipped)
        fmt::print(stderr, "piper-run: --resume: {}\n", line);
      for (const std::string &line : resumePoint.warnings)
        fmt::print(stderr, "piper-run: --resume: warning: {}\n", line);
      if (resumePoint.model || resumePoint.shards)
        fmt::print(stderr, "piper-run: resuming from '{}' (step {})\n",
                   resumePoint.dir, resumePoint.step);
      else
        fmt::print(stderr,
                   "piper-run: --resume: no complete checkpoint in '{}', "
                   "starting fresh\n",
                   options.checkpointDir);
    }
  }
  // Before any step: a file that cannot be written fails now, not after
  // hours of training.
  check(checkOutputTargets(options));
  // After --load, step numbers continue from the checkpoint's: the data
  // windows and AdamW's bias correction see the steps they would have.
  // With --resume, --steps is the total, as an uninterrupted run's.
  lastStep = continuing ? std::max(loadedStep, options.steps)
                        : loadedStep + options.steps;
  // --trace: the step to record, checked before any step runs.
  if (!options.tracePath.empty())
    check(chooseTracedStep(options, continuing, loadedStep + 1, lastStep,
                           tracedStep));
}

void RankRun::connect() {
  std::optional<hal::DeviceKind> kind = hal::parseDeviceKind(options.backend);
  if (!kind)
    exitRank(who + ": backend '" + options.backend + "' is not known");
  deviceKind = *kind;
  check(hal::cudaOrdinalFor(deviceKind, env.localRank, cudaOrdinal));
  if (env.worldSize == 1)
    return;
  const hal::CommunicatorKind commKind =
      hal::communicatorKind(deviceKind, options.comm);
  auto timeout = std::chrono::milliseconds(int64_t(options.timeoutS) * 1000);
  // The watchdog names a stuck or silent rank after --timeout-s; the
  // communicator's own timeout comes later, as a backstop.
  auto commTimeout = timeout + kCommTimeoutSlack;
  hal::Rendezvous meet;
  if (!env.storeDir.empty()) {
    // piper-run's own spawner: one machine, a file store, loopback.
    meet.storeDir = env.storeDir;
  } else {
    std::string fingerprint;
    check(runFingerprint(options, manifest, fingerprint));
    check(meetOverTcp(env, jobIdentity(env, fingerprint), timeout, meeting),
          /*named=*/false);
    const bool nccl = commKind == hal::CommunicatorKind::Nccl;
    fmt::print(stderr,
               "piper-run: {} of {} ({}, local rank {}): met at {}:{}, {} "
               "{}\n",
               who, env.worldSize, env.launcher, env.localRank, env.masterAddr,
               env.masterPort, nccl ? "nccl on CUDA device" : "gloo binds",
               nccl ? std::to_string(cudaOrdinal) : meeting.bindAddress);
    meet.store = meeting.store;
    meet.bindAddress = meeting.bindAddress;
  }
  Status st;
  comm = hal::createCommunicator(commKind, rank, env.worldSize, cudaOrdinal,
                                 meet, commTimeout, st, &staging);
  if (!comm)
    exitRank(who + ": cannot create the communicator: " + st.message());
}

void RankRun::createExecutor() {
  eo.rank = rank;
  eo.seed = options.seed;
  eo.comm = comm.get();
  eo.deviceMemory = options.deviceMemoryBytes;
  eo.packedStepBuffers = !options.unpackStepBuffers;
  // The command line admits only the three names (RunOptions.cpp).
  eo.stepGraphs = options.stepGraph == "on" ? ExecutorOptions::StepGraphs::On
                  : options.stepGraph == "auto"
                      ? ExecutorOptions::StepGraphs::Auto
                      : ExecutorOptions::StepGraphs::Off;
  hal::DeviceOptions deviceOptions;
  // The command line admits only the three names (RunOptions.cpp).
  deviceOptions.attention = hal::parseAttentionChoice(options.attention)
                                .value_or(hal::AttentionChoice::Auto);
  deviceOptions.timeLaunches = profileGpu(options);
  check(hal::createDevice(deviceKind, cudaOrdinal, comm.get(), staging,
                          eo.createDevice, deviceOptions));
  eo.data = data.get();
  // Exit at the first stream error instead of finishing the step: peers
  // blocked on this rank would otherwise wait for their timeout, while an
  // exit makes the launcher stop everyone now.
  // With a watchdog, a communication error waits for its verdict (the peer
  // that failed); any other error is this rank's.
  eo.onStreamError = [this](const Status &status) {
    if (watchdog)
      watchdog->streamFailed(status);
    exitRank(status.message());
  };
  if (faulty)
    check(applyFault(fault, plan, rank, options.backend, eo),
          /*named=*/false);
  eo.profile = options.profile || profileFromEnv();
  eo.traceStep = tracedStep;
  // Reports of every rank go to its log with --log-dir; otherwise rank 0
  // speaks for itself on the shared terminal.
  reports = rank == 0 || !options.logDir.empty();
  Status st;
  exec = Executor::create(plan, eo, st);
  if (!exec)
    exitRank(st.message());
  if (reports && eo.stepGraphs == ExecutorOptions::StepGraphs::Auto &&
      !exec->stepGraphRefusal().empty())
    fmt::print(stderr, "piper-run: {}: steps run as usual, not as graphs: {}\n",
               who, exec->stepGraphRefusal());
  if (checkpoint) {
    check(exec->loadCheckpoint(*checkpoint), /*named=*/false);
    checkpoint.reset();
  }
  if (hfSource) {
    check(exec->loadShards(*hfSource, /*moments=*/false), /*named=*/false);
    hfSource.reset();
  }
  if (resumePoint.model) {
    check(exec->loadCheckpoint(*resumePoint.model), /*named=*/false);
    check(exec->loadOptimizerState(*resumePoint.optimizer), /*named=*/false);
    resumePoint.model.reset();
    resumePoint.optimizer.reset();
  }
  if (resumePoint.shards) {
    check(exec->loadShards(*resumePoint.shards), /*named=*/false);
    resumePoint.shards.reset();
  }
  if (recovered.model) {
    // A replica's own state (of the same tensor-parallel member): its
    // slices as it held them.
    check(exec->loadHeldState(*recovered.model, *recovered.optimizer),
          /*named=*/false);
    recovered.model.reset();
    recovered.optimizer.reset();
  }
}

void RankRun::startWatch() {
  // --standby: the state at the last two step boundaries, handed off when a
  // peer fails (the launcher then picks the step every survivor finished).
  handoffDir = std::getenv(kHandoffDirVar);
  // (Not under ZeRO or expert parallelism: no replica holds a copy of a
  // rank's shard, and the launcher then sets no handoff folder.)
  if (handoffDir && *handoffDir && env.worldSize > 1 && handsOffState(plan))
    snapshots = std::make_unique<StepSnapshots>();
  check(exec->connect(), /*named=*/false);
  if (runId.empty())
    runId = newRunId();
  check(shareRunId(comm.get(), rank, runId), /*named=*/false);
  exec->setRunId(runId);
  if (snapshots)
    check(snapshots->take(*exec, loadedStep), /*named=*/false);
  if (env.worldSize > 1) {
    watchdog = std::make_unique<Watchdog>(
        rank, env.worldSize,
        std::chrono::milliseconds(int64_t(options.timeoutS) * 1000),
        env.storeDir.empty() ? tcpWatchStore(meeting.store)
                             : fileWatchStore(env.storeDir),
        *exec);
    watchdog->storeOwner = env.storeDir.empty() ? 0 : -1;
    if (snapshots) {
      std::string dir = fmt::format("{}/rank-{}", handoffDir, rank);
      watchdog->beforePeerFailedExit = [this, dir] {
        Status st = snapshots->write(dir);
        if (!st)
          fmt::print(stderr, "piper-run: {}: cannot hand off its state: {}\n",
                     who, st.message());
      };
    }
    watchdog->start();
  }
  // --trace: the parts of the other ranks reach rank 0 through the
  // rendezvous store (the local folder or rank 0's TCP store).
  if (tracedStep > 0 && env.worldSize > 1)
    traceStore = env.storeDir.empty() ? tcpWatchStore(meeting.store)
                                      : fileWatchStore(env.storeDir);
}

int runRank(const RunOptions &options, const RankEnv &env,
            const LoadedStrategy *loaded) {
  // Under --log-dir stderr is this rank's log. On a full disk fmt::print
  // throws and fprintf drops the line: either way lines are lost, so the
  // rank fails with its own exit code, which the launcher names.
  auto logLost = [&] {
    exitRank(fmt::format("rank {}: --log-dir '{}': a write to the log failed, "
                         "lines are missing",
                         env.rank, options.logDir),
             kExitLogLost);
  };
  int rc;
  try {
    rc = RankRun(options, env, loaded).run();
  } catch (const std::system_error &) {
    if (!options.logDir.empty() && std::ferror(stderr))
      logLost();
    throw;
  }
  if (!options.logDir.empty() &&
      (std::fflush(stderr) != 0 || std::ferror(stderr)))
    logLost();
  return rc;
}

} // namespace piper::runtime
