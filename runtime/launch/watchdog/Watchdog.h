// Hang and crash detection: every rank publishes a heartbeat with its plan
// position through the rendezvous store, watches the others', and when a
// rank dies, stops or stops making progress, every rank prints who failed
// and where each rank was, and exits (docs/operations.md, "Reading a hang
// report"). Also PIPER_FAULT, the fault injection of the tests.
#ifndef PIPER_RUNTIME_LAUNCH_WATCHDOG_WATCHDOG_H
#define PIPER_RUNTIME_LAUNCH_WATCHDOG_WATCHDOG_H

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/TcpStore.h"
#include "runtime/exec/Executor.h"
#include "support/Status.h"

namespace piper::runtime {

/// Exit codes of a rank (docs/operations.md): 1 is "this rank failed".
constexpr int kExitPeerFailed = 4;

/// The keys the watchdog uses, for the launcher too.
std::string heartbeatKey(int rank);
constexpr const char *kAbortKey = "piper-watch-abort";

/// The small key-value interface the watchdog needs from a rendezvous store.
class WatchStore {
public:
  virtual ~WatchStore() = default;
  /// Sets `key`, replacing its value.
  virtual Status put(const std::string &key, const std::string &value) = 0;
  /// Sets `key` unless it is set; `wrote` says whether this call set it.
  virtual Status putOnce(const std::string &key, const std::string &value,
                         bool &wrote) = 0;
  /// Reads `key` without waiting.
  virtual Status get(const std::string &key, std::string &value,
                     bool &present) = 0;
};

/// piper-run's local rendezvous folder: one file per key, replaced by rename
/// (put) or created by link (putOnce: the first writer wins).
std::unique_ptr<WatchStore> fileWatchStore(const std::string &dir);
/// The TCP store that rank 0 serves.
std::unique_ptr<WatchStore> tcpWatchStore(std::shared_ptr<TcpStore> store);

/// The verdict kept under kAbortKey: the failed rank and why.
struct Abort {
  int culprit = -1;
  std::string reason;
  /// The culprit could not be told from the others (ranks waiting on each
  /// other): named, but no spare takes its place on a guess.
  bool guess = false;
};
std::string encodeAbort(const Abort &abort);
bool decodeAbort(const std::string &text, Abort &abort);

/// PIPER_FAULT="rank=R,step=S,stream=NAME,inst=I,action=crash|stall|hang_comm
/// |hang_inside|device_error,attempt=A" (docs/operations.md). hang_comm
/// blocks just before a communication (the rank never arrives); hang_inside
/// just after it began (as a rank whose transport died inside a
/// collective); device_error makes the device's next operation fail, as a
/// CUDA call can (--backend cuda-emulation only). step defaults to 1, inst
/// to 0, stream to the plan's first stream; attempt (the launch
/// PIPER_ATTEMPT numbers, from 0, under --max-restarts) to every attempt.
/// at=checkpoint (crash or stall only, no stream or inst) acts instead
/// inside the checkpoint written after step S (--checkpoint-every): once
/// the rank's own files are written, before the barrier that completes it.
struct FaultSpec {
  enum Action {
    kCrash,
    kStall,
    kHangComm,
    kHangInside,
    kDeviceError,
    kHangData
  };
  int rank = -1;
  int64_t step = 1;
  std::string stream;
  int instruction = 0;
  Action action = kCrash;
  int attempt = -1;
  bool atCheckpoint = false;
};
/// Parses PIPER_FAULT's value; errors say what is wrong and the syntax.
Status parseFault(const std::string &text, FaultSpec &fault);
/// Reads PIPER_FAULT; `set` is false when it is unset or empty.
Status faultFromEnv(FaultSpec &fault, bool &set);
/// Fills `options`' fault fields for this rank's `plan` on `backend` (its
/// --backend; nothing when the fault is another rank's); errors name a
/// stream or instruction the plan lacks, a hang on an instruction that does
/// not communicate, or a device_error on a backend that cannot inject one.
Status applyFault(const FaultSpec &fault, const plan::Plan &plan, int rank,
                  const std::string &backend, ExecutorOptions &options);
/// An at=checkpoint fault needs a checkpoint after its step: an error
/// naming --checkpoint-every otherwise.
Status checkFaultCheckpoint(const FaultSpec &fault, int64_t checkpointEvery);
/// The action of an at=checkpoint fault for this rank's checkpoint of
/// `step`, or an empty function.
std::function<void()> checkpointFault(const FaultSpec &fault, int rank,
                                      int64_t step);

/// The ranks (other than this one) that instruction `inst` of this rank's
/// plan waits on: a RECV's peer, a collective's group; a SEND waits on
/// nobody (sends are asynchronous).
std::vector<int> waitsOn(const plan::Plan &plan, int replica,
                         const plan::Instruction &inst, int rank);

/// One rank's watchdog: a thread that publishes this rank's heartbeat every
/// second and checks the others' four times a second. Verdicts, in order:
/// a rank named under kAbortKey (by a rank that failed with an error of its
/// own, by another watchdog, or by the local launcher); a rank whose
/// heartbeat has not changed for `timeout` (killed, crashed or stopped); a
/// rank whose plan position has not changed for `timeout` while in a step
/// (stuck). On a verdict it records it under kAbortKey (the first one
/// stands), prints the report and exits: 1 when this rank failed,
/// kExitPeerFailed when another did.
class Watchdog {
public:
  Watchdog(int rank, int worldSize, std::chrono::milliseconds timeout,
           std::unique_ptr<WatchStore> store, const Executor &exec);
  ~Watchdog();
  Watchdog(const Watchdog &) = delete;
  Watchdog &operator=(const Watchdog &) = delete;

  void start();
  /// After the last step: publishes "done" and stops watching.
  void finish();
  /// A stream's error. A communication error (the failed stream was in a
  /// SEND, RECV, collective or waiting for its sends, or the step's loss
  /// all-reduce failed) is most likely a peer's failure: wait for a verdict
  /// up to `timeout` + 1 s, then take the blame. Any other error is this
  /// rank's own, and so is a diverged one (Status::isDiverged: every rank
  /// finds it at once). Never returns.
  [[noreturn]] void streamFailed(const Status &status);
  /// Between steps, this rank is in world collectives of its own (a
  /// checkpoint's barriers): `what` ("checkpoint step 3") shows in its
  /// heartbeat and in reports as its position, waiting on every other rank.
  /// "" ends it.
  void setActivity(const std::string &what);
  /// A world collective of the activity failed: most likely a peer did (a
  /// rank killed inside a checkpoint write). As streamFailed on a
  /// communication error: waits for a verdict up to `timeout` + 1 s, then
  /// takes the blame. Never returns.
  [[noreturn]] void collectiveFailed(const Status &status);
  /// Records this rank as the culprit (unless a verdict stands), prints the
  /// report; exitRank then exits. Installed as exitRank's hook.
  void ownFailure(const std::string &message);
  /// Publishes the heartbeat now (PIPER_FAULT, just before it acts).
  void publishNow();
  /// publishNow() of the running watchdog, if one runs.
  static void publishActive();

  /// How often heartbeats are published and peers checked (tests may
  /// shorten them).
  std::chrono::milliseconds publishEvery{1000};
  std::chrono::milliseconds pollEvery{250};
  /// The rank that serves the store (0 for the TCP store), blamed when the
  /// store stops answering; -1 (a local folder) blames this rank.
  int storeOwner = -1;
  /// Runs on the watchdog's thread when a verdict names another rank, after
  /// the report and before the exit (--standby: hand this rank's state off).
  std::function<void()> beforePeerFailedExit;

private:
  struct Peer {
    bool seen = false;
    std::string text;                              // the last heartbeat
    std::string seq;                               // its sequence number
    std::chrono::steady_clock::time_point changed; // when seq last changed
    std::string state;                             // run, error, done
    int64_t stillMs = 0;                           // as published
    std::vector<int> waits;
    int64_t step = 0;
    int phase = 0;
  };
  void loop();
  void publish(const char *state);
  std::string describeSelf(const ExecPosition &pos, std::vector<int> &waits);
  /// Reads the heartbeats of the peers this rank watches, or of all of
  /// them (`all`, for a report).
  void readPeers(bool all = false);
  /// Rank 0 watches every rank; the others watch rank 0 alone, and learn of
  /// any other verdict from the store: O(N) reads per poll in all, not
  /// O(N^2).
  bool watches(int r) const { return r != rank && (rank == 0 || r == 0); }
  bool decide(Abort &verdict);
  [[noreturn]] void conclude(Abort verdict);
  /// The store's owner (TCP), once concluded: keeps serving the store
  /// until every other rank has read the verdict and stopped.
  void serveUntilPeersStop();
  std::string report(const Abort &verdict);
  /// Publishes `verdict` unless another rank's stands (then adopts that
  /// one), reads every peer and returns the report. Takes `mu`.
  std::string settle(Abort &verdict);
  bool communicating(const ExecPosition &pos) const;

  int rank, worldSize;
  std::chrono::milliseconds timeout;
  std::unique_ptr<WatchStore> store;
  const Executor &exec;
  std::mutex mu; // the store, peers and the self state
  std::vector<Peer> peers;
  int64_t seq = 0;
  std::string state = "run";
  std::string errorMessage;
  std::string activity; // setActivity's; guarded by mu
  ExecPosition lastPos;
  std::chrono::steady_clock::time_point progressAt, startedAt, publishedAt;
  std::string storeError;
  std::chrono::steady_clock::time_point storeErrorSince;
  bool storeFailing = false;
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::condition_variable wake;
  std::mutex wakeMu;
  std::atomic<bool> concluding{false};
};

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_WATCHDOG_WATCHDOG_H
