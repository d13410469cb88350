// The steps of one rank's run (RunRank.cpp: from the log to the executor
// with its state; RankSteps.cpp: the training steps, reports and saves).
// Internal to runtime/launch: runRank (RunRank.h) is the entry point.
#ifndef PIPER_RUNTIME_LAUNCH_RANK_RANKRUN_H
#define PIPER_RUNTIME_LAUNCH_RANK_RANKRUN_H

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/exec/Executor.h"
#include "runtime/formats/Safetensors.h"
#include "runtime/hal/Backends.h"
#include "runtime/launch/checkpoints/CheckpointLock.h"
#include "runtime/launch/checkpoints/Checkpoints.h"
#include "runtime/launch/checkpoints/HfFolders.h"
#include "runtime/launch/checkpoints/StrategyFiles.h"
#include "runtime/launch/rank/Progress.h"
#include "runtime/launch/rank/Reporting.h"
#include "runtime/launch/rank/RunRank.h"
#include "runtime/launch/rank/Standby.h"
#include "runtime/launch/rendezvous/TcpRendezvous.h"
#include "runtime/launch/watchdog/Watchdog.h"

namespace piper::runtime {

/// One rank's run, step by step; every failure ends the process through
/// exitRank, naming the rank. The members are the run's state in the order
/// it comes into being (and leaves in reverse: the executor before the
/// watchdog, the communicator before the rendezvous store it uses).
class RankRun {
public:
  using Clock = std::chrono::steady_clock;
  RankRun(const RunOptions &options, const RankEnv &env,
          const LoadedStrategy *loaded);
  /// The whole run: 0, or the process has exited.
  int run();

private:
  // RunRank.cpp, in order.
  /// --log-dir under another launcher; BLAS threads shared by local ranks.
  void openLog();
  /// The manifest, this rank's class and its plan.
  void loadRankPlan();
  /// PIPER_FAULT and PIPER_ATTEMPT.
  void readFaults();
  /// The checkpoint lock, the data, and where the run starts: --load, a
  /// standby recovery or --resume; the last step and the traced step.
  void openStartState();
  /// The rendezvous and the communicator of the backend.
  void connect();
  /// The device, the executor and the state it starts from.
  void createExecutor();
  /// Step snapshots, the run id, the watchdog and the trace store.
  void startWatch();
  // RankSteps.cpp.
  /// The steps: reports, metrics, checkpoints.
  void train();
  /// After the last step: trace parts, peak memory, reports and saves.
  void finish();

  /// Ends the rank when `st` failed (`named`: its message after "rank R: ").
  void check(const Status &st, bool named = true);
  /// Every class's plan (--load, --resume and MFU check against them all).
  Status allPlans(std::vector<plan::Plan> &plans);

  const RunOptions &options;
  const RankEnv &env;
  const LoadedStrategy *loaded;
  const Clock::time_point runStart;
  const int rank;
  const std::string who;

  plan::Manifest manifest;
  int cls = -1;
  plan::Plan plan;
  FaultSpec fault;
  bool faulty = false;
  std::unique_ptr<CheckpointDirLock> checkpointLock;
  std::unique_ptr<TokenFileData> data;
  std::unique_ptr<SafetensorsReader> checkpoint;
  /// --load of a Hugging Face folder.
  std::unique_ptr<HfStateSource> hfSource;
  int64_t loadedStep = 0;
  /// The run's identity in the files it writes: the one of the state it
  /// continues, else a new one; rank 0's, once the ranks are connected.
  std::string runId;
  bool recovering = false;
  RecoveredState recovered;
  /// Runs that continue an earlier one: --steps is the total.
  bool continuing = false;
  RunIdentity identity;
  ResumePoint resumePoint;
  int64_t lastStep = 0;
  int64_t tracedStep = -1;

  hal::DeviceKind deviceKind = hal::DeviceKind::Cpu;
  int cudaOrdinal = 0;
  /// Declared before the communicator, which uses its store until it goes.
  TcpMeeting meeting;
  std::unique_ptr<Communicator> comm;
  hal::StagingCommunicator *staging = nullptr;

  ExecutorOptions eo;
  std::unique_ptr<Watchdog> watchdog;
  /// Reports of every rank go to its log with --log-dir; otherwise rank 0
  /// speaks for itself on the shared terminal.
  bool reports = false;
  std::unique_ptr<Executor> exec;
  const char *handoffDir = nullptr;
  std::unique_ptr<StepSnapshots> snapshots;
  std::unique_ptr<WatchStore> traceStore;

  MetricsFile metrics;
  double tokens = 0;
  std::unique_ptr<Progress> progress;
  int64_t profiledFrom = 0;
  double profiledSeconds = 0;
};

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_RANK_RANKRUN_H
