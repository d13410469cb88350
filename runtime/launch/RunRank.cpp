// A rank's main: load and check its plan, open the data and --load, create
// the communicator and executor, run the steps and report, then save.
#include "runtime/launch/RunRank.h"

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

#include "runtime/checkpoint/Integrity.h"
#include "runtime/checkpoint/Safetensors.h"
#include "runtime/comm/Communicator.h"
#include "runtime/support/AtomicFile.h"
#include "runtime/exec/Executor.h"
#include "runtime/hal/StagingCommunicator.h"
#include "runtime/hal/cuda/CudaBackend.h"
#include "runtime/hal/cuda/NcclCommunicator.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"
#include "runtime/launch/CheckpointIO.h"
#include "runtime/launch/CheckpointLock.h"
#include "runtime/launch/Checkpoints.h"
#include "runtime/launch/Children.h"
#include "runtime/launch/Progress.h"
#include "runtime/launch/Reporting.h"
#include "runtime/launch/Standby.h"
#include "runtime/launch/StrategyFiles.h"
#include "runtime/launch/TcpRendezvous.h"
#include "runtime/launch/Trace.h"
#include "runtime/launch/Watchdog.h"

namespace piper::runtime {

namespace {

using Clock = std::chrono::steady_clock;

/// The device class of the manifest that lists `rank`, or -1.
int classOf(const plan::Manifest &manifest, int rank) {
  for (int c = 0; c < manifest.classes_size(); ++c)
    for (int r : manifest.classes(c).ranks())
      if (r == rank)
        return c;
  return -1;
}

/// Tokens of one step over all replicas (for tokens/s): from the manifest's
/// training config, else the plan's.
double tokensPerStep(const plan::Manifest &manifest, const plan::Plan &plan) {
  const plan::TrainingConfig &t = manifest.training().num_microbatches() > 0
                                      ? manifest.training()
                                      : plan.training();
  return double(std::max(1, t.num_replicas())) * t.num_microbatches() *
         t.microbatch_size() * t.seq_len();
}

/// The peak arena memory of every rank, indexed by rank: this rank's
/// `peakBytes` gathered through a world sum (exact below 2^53 bytes).
Status peakBytesPerRank(Communicator *comm, int rank, int worldSize,
                        int64_t peakBytes, std::vector<int64_t> &out) {
  std::vector<double> slots(worldSize, 0.0);
  slots[rank] = double(peakBytes);
  if (comm)
    PIPER_RETURN_IF_ERROR(comm->allReduceSumWorld(slots.data(), slots.size())
                              .withContext("gathering peak memory"));
  out.assign(slots.begin(), slots.end());
  return Status::ok();
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

} // namespace

/// How much longer than --timeout-s a communication may wait, so that the
/// watchdog (which acts at --timeout-s) names the culprit first.
constexpr std::chrono::milliseconds kCommTimeoutSlack{2000};

/// runRank's work; runRank adds what a log that cannot be written means.
static int runRankLogged(const RunOptions &options, const RankEnv &env,
                         const LoadedStrategy *loaded) {
  const auto runStart = Clock::now();
  const int rank = env.rank;
  const std::string who = fmt::format("rank {}", rank);
  initFailureReport(rank);
  // The launcher stops ranks with SIGTERM; a user with ^C.
  removeTempFilesOnSignals();
  auto check = [&](const Status &st, bool named = true) {
    if (!st)
      exitRank(named ? who + ": " + st.message() : st.message());
  };

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

  plan::Manifest manifest;
  if (loaded)
    manifest = loaded->manifest;
  else
    check(loadManifest(options, manifest));
  if (manifest.world_size() != env.worldSize)
    exitRank(fmt::format("{}: the strategy needs {} ranks, the {} world has "
                         "{}",
                         who, manifest.world_size(), env.launcher,
                         env.worldSize));
  int cls = classOf(manifest, rank);
  if (cls < 0)
    exitRank(who + ": no device class of the manifest lists this rank");
  plan::Plan plan;
  if (loaded)
    plan = loaded->plans.at(cls);
  else
    check(loadPlan(options, manifest, cls, plan));
  // Every class's plan (--load, --resume and MFU check against them all).
  auto allPlans = [&](std::vector<plan::Plan> &plans) {
    if (!loaded)
      return loadPlans(options, manifest, plans);
    plans = loaded->plans;
    return Status::ok();
  };
  // PIPER_FAULT (tests): checked on every rank, applied by the one it names.
  FaultSpec fault;
  bool faulty = false;
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

  // One job at a time in a --checkpoint-dir: rank 0 holds the lock unless
  // the local launcher, its parent, does (CheckpointLock.h).
  std::unique_ptr<CheckpointDirLock> checkpointLock;
  if (rank == 0 && !options.checkpointDir.empty())
    check(CheckpointDirLock::acquire(options.checkpointDir, jobName(env),
                                     checkpointLock));

  std::unique_ptr<TokenFileData> data;
  if (loadsBatches(plan))
    check(openData(options, plan.training(), options.seed, data));

  // --load is checked against every class's parameters, so that a tensor
  // no class holds is an error here too when ranks are started by hand.
  std::unique_ptr<SafetensorsReader> checkpoint;
  int64_t loadedStep = 0;
  // The run's identity in the files it writes: the one of the state it
  // continues, else a new one; rank 0's, once the ranks are connected.
  std::string runId;
  if (!options.loadPath.empty()) {
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
  const bool recovering = recoveryDir && *recoveryDir;
  RecoveredState recovered;
  if (recovering) {
    check(openRecoveredState(recoveryDir, cls, recovered));
    loadedStep = recovered.step;
    runId = recovered.runId;
  }
  // Runs that continue an earlier one: --steps is the total.
  const bool continuing = options.resume || recovering;
  // --resume: every rank finds the same checkpoint (nothing writes to
  // --checkpoint-dir before the first step, which all ranks take part in).
  const RunIdentity identity = runIdentity(options, manifest, plan);
  ResumePoint resumePoint;
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
  const int64_t lastStep = continuing ? std::max(loadedStep, options.steps)
                                      : loadedStep + options.steps;
  // --trace: the step to record, checked before any step runs.
  int64_t tracedStep = -1;
  if (!options.tracePath.empty())
    check(chooseTracedStep(options, continuing, loadedStep + 1, lastStep,
                           tracedStep));

  // Declared before the communicator, which uses its store until it goes.
  TcpMeeting meeting;
  std::unique_ptr<Communicator> comm;
  // Multi-rank communicators: Gloo over host memory on the CPU; NCCL
  // between GPUs; with --comm gloo on a GPU (and on the emulated GPU), Gloo
  // staged through host memory, so that several ranks can share one device.
  const bool onCuda = options.backend == "cuda";
  const bool useNccl = onCuda && options.comm != "gloo";
  const bool staged =
      options.backend == "cuda-emulation" || (onCuda && options.comm == "gloo");
  hal::StagingCommunicator *staging = nullptr;
  int cudaOrdinal = 0;
  if (onCuda) {
    // One rank per GPU: local rank r uses visible CUDA device r (modulo
    // their number, so ranks may share one). CUDA_VISIBLE_DEVICES chooses
    // which GPUs a node's ranks see (docs/gpu.md).
    int gpus = 0;
    check(hal::cudaDeviceCount(gpus).withContext("backend 'cuda'"),
          /*named=*/true);
    cudaOrdinal = gpus > 0 ? env.localRank % gpus : 0;
  }
  if (env.worldSize > 1) {
    Status st;
    auto timeout = std::chrono::milliseconds(int64_t(options.timeoutS) * 1000);
    // The watchdog names a stuck or silent rank after --timeout-s; the
    // communicator's own timeout comes later, as a backstop.
    auto commTimeout = timeout + kCommTimeoutSlack;
    if (!env.storeDir.empty()) {
      // piper-run's own spawner: one machine, a file store, loopback.
      comm = useNccl ? hal::createNcclCommunicator(rank, env.worldSize,
                                                   cudaOrdinal, env.storeDir,
                                                   commTimeout, st)
                     : createGlooCommunicator(rank, env.worldSize,
                                              env.storeDir, commTimeout, st);
    } else {
      std::string fingerprint;
      check(runFingerprint(options, manifest, fingerprint));
      check(meetOverTcp(env, jobIdentity(env, fingerprint), timeout, meeting),
            /*named=*/false);
      fmt::print(stderr,
                 "piper-run: {} of {} ({}, local rank {}): met at {}:{}, "
                 "{} {}\n",
                 who, env.worldSize, env.launcher, env.localRank,
                 env.masterAddr, env.masterPort,
                 useNccl ? "nccl on CUDA device" : "gloo binds",
                 useNccl ? std::to_string(cudaOrdinal) : meeting.bindAddress);
      comm = useNccl ? hal::createNcclCommunicator(rank, env.worldSize,
                                                   cudaOrdinal, meeting.store,
                                                   commTimeout, st)
                     : createGlooCommunicator(rank, env.worldSize,
                                              meeting.store, commTimeout, st,
                                              meeting.bindAddress);
    }
    if (!comm || !st)
      exitRank(who + ": cannot create the communicator: " +
               (st ? std::string("unknown error") : st.message()));
    if (staged) {
      auto wrapped = std::make_unique<hal::StagingCommunicator>(std::move(comm));
      staging = wrapped.get();
      comm = std::move(wrapped);
    }
  }

  ExecutorOptions eo;
  eo.rank = rank;
  eo.seed = options.seed;
  eo.comm = comm.get();
  if (onCuda) {
    Status created;
    auto device = std::make_shared<std::unique_ptr<hal::Device>>(
        hal::createCudaDevice(cudaOrdinal, comm.get(), created));
    if (!*device)
      exitRank(who + ": backend 'cuda': " + created.message());
    if (staging)
      staging->attach((*device)->allocator());
    // Created here, where an error can be reported; handed over once.
    eo.createDevice = [device](Communicator *) { return std::move(*device); };
  } else if (options.backend == "cuda-emulation") {
    eo.createDevice = [staging](Communicator *c) {
      auto device = hal::createEmulatedGpuDevice(c);
      if (staging)
        staging->attach(device->allocator());
      return device;
    };
  }
  eo.data = data.get();
  // Exit at the first stream error instead of finishing the step: peers
  // blocked on this rank would otherwise wait for their timeout, while an
  // exit makes the launcher stop everyone now.
  // With a watchdog, a communication error waits for its verdict (the peer
  // that failed); any other error is this rank's.
  std::unique_ptr<Watchdog> watchdog;
  eo.onStreamError = [&watchdog](const Status &status) {
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
  const bool reports = rank == 0 || !options.logDir.empty();
  Status st;
  auto exec = Executor::create(plan, eo, st);
  if (!exec)
    exitRank(st.message());
  if (checkpoint) {
    check(exec->loadCheckpoint(*checkpoint), /*named=*/false);
    checkpoint.reset();
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
    check(exec->loadCheckpoint(*recovered.model), /*named=*/false);
    check(exec->loadOptimizerState(*recovered.optimizer), /*named=*/false);
    recovered.model.reset();
    recovered.optimizer.reset();
  }
  // --standby: the state at the last two step boundaries, handed off when a
  // peer fails (the launcher then picks the step every survivor finished).
  const char *handoffDir = std::getenv(kHandoffDirVar);
  std::unique_ptr<StepSnapshots> snapshots;
  // (Not under ZeRO: a rank holds only its shard, and the launcher then
  // sets no handoff folder.)
  if (handoffDir && *handoffDir && env.worldSize > 1 && !exec->shardsState())
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
      watchdog->beforePeerFailedExit = [&snapshots, dir, who] {
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
  std::unique_ptr<WatchStore> traceStore;
  if (tracedStep > 0 && env.worldSize > 1)
    traceStore = env.storeDir.empty() ? tcpWatchStore(meeting.store)
                                      : fileWatchStore(env.storeDir);

  long long failRank = -1, failStep = -1;
  std::string envError;
  if (!envInt("PIPER_TEST_FAIL_RANK", failRank, envError) ||
      !envInt("PIPER_TEST_FAIL_STEP", failStep, envError))
    failRank = failStep = -1;
  if (!envError.empty())
    exitRank(who + ": " + envError);

  // What a run cut off while writing a checkpoint left (no rank writes
  // there before the first step).
  if (rank == 0 && !options.checkpointDir.empty())
    removeIncompleteCheckpoints(options.checkpointDir);

  MetricsFile metrics;
  if (rank == 0 && !options.metricsPath.empty()) {
    // A resumed run continues the metrics of the steps it keeps.
    if (continuing)
      check(keepMetricsUpTo(options.metricsPath, loadedStep));
    check(metrics.open(options.metricsPath, continuing));
  }
  const double tokens = tokensPerStep(manifest, plan);

  if (continuing && rank == 0 && loadedStep >= options.steps)
    fmt::print(stderr,
               "piper-run: --resume: step {} reached --steps {}, no step "
               "to run\n",
               loadedStep, options.steps);
  // After a restart (--max-restarts): when the launcher saw the failure.
  long long failedAtNs = -1;
  std::string failedAtError;
  if (!envInt("PIPER_RESTART_FAILED_AT_NS", failedAtNs, failedAtError))
    failedAtNs = -1;
  Progress progress(loadedStep + 1, lastStep, options.logEvery, tokens);
  if (rank == 0 && exec->peakFlops() > 0) {
    // MFU needs every class's parameters; only a backend that knows its
    // peak pays for reading them.
    std::vector<plan::Plan> plans;
    check(allPlans(plans));
    progress.setFlops(modelFlopsPerStep(plans, tokens),
                      exec->peakFlops() * env.worldSize);
  }
  // --profile leaves out the first step (allocator and BLAS warm-up) unless
  // it is the only one.
  int64_t profiledFrom = loadedStep + 1;
  double profiledSeconds = 0;
  for (int64_t step = loadedStep + 1; step <= lastStep; ++step) {
    if (rank == failRank && step == failStep)
      exitRank(fmt::format("{}: failing at the start of step {} on purpose "
                           "(PIPER_TEST_FAIL_RANK/PIPER_TEST_FAIL_STEP)",
                           who, step),
               3);
    auto start = Clock::now();
    double loss = 0;
    Status stepStatus = exec->runStep(step, loss);
    if (!stepStatus && watchdog)
      watchdog->streamFailed(stepStatus);
    check(stepStatus, /*named=*/false);
    double seconds =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (snapshots)
      check(snapshots->take(*exec, step), /*named=*/false);
    if (options.checkpointEvery > 0 && step % options.checkpointEvery == 0) {
      CheckpointStats stats;
      check(writeStepCheckpoint(options.checkpointDir, options.keepCheckpoints,
                                identity, manifest, *exec, comm.get(), rank,
                                step, stats),
            /*named=*/false);
      if (rank == 0)
        fmt::print(stderr,
                   "piper-run: checkpoint '{}' written: {:.2f} MB in {:.3f} "
                   "s\n",
                   checkpointStepDir(options.checkpointDir, step),
                   stats.bytes / 1e6, stats.seconds);
    }
    if (rank == 0 && failedAtNs >= 0 && step == loadedStep + 1) {
      auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     Clock::now().time_since_epoch())
                     .count();
      const char *note = std::getenv(kRecoveryNoteVar);
      fmt::print(stderr,
                 "piper-run: {}training again: step {} done {:.2f} s after "
                 "the failure\n",
                 note && *note ? std::string(note) + "; " : std::string(),
                 step, (now - failedAtNs) / 1e9);
    }
    if (eo.profile && step == loadedStep + 1 && lastStep > step) {
      exec->resetProfile();
      profiledFrom = step + 1;
    } else {
      profiledSeconds += seconds;
    }
    if (rank != 0)
      continue;
    StepReport report;
    report.step = step;
    report.loss = loss;
    report.stepSeconds = seconds;
    report.tokensPerS = seconds > 0 ? tokens / seconds : 0.0;
    report.lr = exec->plan().training().lr() * exec->lrScale(step);
    report.gradNorm = exec->lastGradNorm();
    report.peakBytes = exec->peakBytes();
    report.maxRssBytes = maxRssBytes();
    std::string line = progress.record(report);
    if (!line.empty()) {
      fmt::print("{}\n", line);
      std::fflush(stdout);
    }
    check(metrics.write(report));
  }
  // --trace: every rank hands in its part before the world collective
  // below, which is thus the barrier after which rank 0 finds them all.
  std::string tracePart;
  if (tracedStep > 0) {
    tracePart =
        traceRankPart(exec->plan(), rank, hostName(), exec->stepTrace());
    if (traceStore && rank != 0)
      check(traceStore->put(traceKey(rank), tracePart)
                .withContext("--trace: handing in its part"));
  }
  // A world collective, even after no steps: it is then the barrier that
  // keeps a rank from exiting while a peer still connects to it.
  std::vector<int64_t> peaks;
  Status gathered = peakBytesPerRank(comm.get(), rank, env.worldSize,
                                     exec->peakBytes(), peaks);
  if (!gathered && watchdog)
    watchdog->streamFailed(gathered);
  check(gathered);
  if (watchdog)
    watchdog->finish();
  check(metrics.close());
  if (reports) {
    if (eo.profile && lastStep >= profiledFrom)
      fmt::print(stderr, "{}",
                 profileTable(who, *exec, profiledFrom,
                              lastStep - profiledFrom + 1, profiledSeconds));
    fmt::print(stderr, "{}", memoryReport(who, *exec));
    std::fflush(stderr);
  }

  if (!options.saveParamsDir.empty() &&
      (exec->replicaIndex() == 0 || exec->shardsState()))
    check(exec->saveParams(options.saveParamsDir), /*named=*/false);
  if (!options.savePath.empty())
    check(writeCheckpoint(options.savePath, CheckpointContent::Params, manifest,
                          *exec, comm.get(), rank, lastStep),
          /*named=*/false);
  if (!options.saveGradsPath.empty())
    check(writeCheckpoint(options.saveGradsPath, CheckpointContent::Gradients,
                          manifest, *exec, comm.get(), rank, lastStep),
          /*named=*/false);
  if (tracedStep > 0 && rank == 0)
    check(writeMeasuredTrace(options.tracePath, traceStore.get(),
                             env.worldSize, tracePart));
  if (rank == 0) {
    double wall =
        std::chrono::duration<double>(Clock::now() - runStart).count();
    fmt::print("{}", progress.summary(peaks, wall));
    std::fflush(stdout);
  }
  return 0;
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
    rc = runRankLogged(options, env, loaded);
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
