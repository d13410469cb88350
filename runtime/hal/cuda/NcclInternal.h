// Internal to the NCCL communicator (NcclCommunicator.h): its state and the
// methods its files share. NcclCommunicator.cpp sets communicators up and
// binds streams; NcclWork.cpp issues operations and completes them (events,
// staging of host buffers, asynchronous errors, timeouts);
// NcclCollectives.cpp and NcclPointToPoint.cpp are the operations.
#ifndef PIPER_RUNTIME_HAL_CUDA_NCCLINTERNAL_H
#define PIPER_RUNTIME_HAL_CUDA_NCCLINTERNAL_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/Communicator.h"
#include "runtime/hal/cuda/NcclLibrary.h"

namespace gloo::rendezvous {
class Store;
} // namespace gloo::rendezvous

namespace piper::runtime::hal::nccl {

using Clock = std::chrono::steady_clock;

/// Store prefix of the world control communicator; never equal to a key's
/// str(), which always ends in ']'.
constexpr const char *kWorld = "__world__";

ncclDataType_t ncclType(CommDType type);
/// "[0,1,2]".
std::string rankList(const std::vector<int> &ranks);

/// One key's NCCL communicator(s).
struct Group {
  CommKey key;
  int position = 0; // this rank's index in key.ranks (its NCCL rank)
  /// Collectives; for a pair, also the sends of its lower rank.
  ncclComm_t comm = nullptr;
  /// A pair only: the sends of its higher rank.
  ncclComm_t reverse = nullptr;
  /// A pair only: where this rank's sends run, after `ready` (recorded on
  /// the caller's stream when its data are ready).
  cudaStream_t sendStream = nullptr;
  cudaEvent_t ready = nullptr;
  /// Recorded after each operation (on its stream, and on sendStream): at
  /// destruction, whether work is still in flight.
  cudaEvent_t tail = nullptr;
  cudaEvent_t sendTail = nullptr;

  std::mutex mu; // guards issuing, failure and aborting
  std::string failure;
  bool aborted = false;

  int size() const { return static_cast<int>(key.ranks.size()); }
  bool pair() const { return size() == 2; }
  ncclComm_t sendComm() const { return position == 0 ? comm : reverse; }
  ncclComm_t recvComm() const { return position == 0 ? reverse : comm; }
};

/// Host buffers of one operation staged in temporary device memory
/// (stream-ordered allocation), copied back by the work's wait().
struct Staging {
  struct Buffer {
    void *host;
    void *device;
    size_t bytes;
    bool copyBack;
  };
  cudaStream_t stream = nullptr;
  std::vector<Buffer> buffers;

  bool any() const { return !buffers.empty(); }

  /// Replaces `ptr` by device memory holding its `bytes` when it is host
  /// memory. `copyIn`: the operation reads it; `copyBack`: it writes it.
  Status stage(void *&ptr, size_t bytes, bool copyIn, bool copyBack);
  Status in(const void *&ptr, size_t bytes);
  Status out(void *&ptr, size_t bytes) {
    return stage(ptr, bytes, false, true);
  }
  Status inOut(void *&ptr, size_t bytes) {
    return stage(ptr, bytes, true, true);
  }
  /// Copies the results back (when `copy`) and frees the device memory.
  Status finish(bool copy);
};

/// Where an operation is issued: the CUDA stream bound to its logical
/// stream (Communicator::bindDeviceStream), or the communicator's own host
/// stream for an unbound one.
struct IssueStream {
  cudaStream_t stream = nullptr;
  bool bound = false;
};

class NcclCommunicator;

/// The completion of one operation: a CUDA event after it. On a bound
/// stream (and without staging) wait() orders that stream after the event;
/// otherwise it waits on the host.
class NcclWork final : public CommWork {
public:
  NcclWork(NcclCommunicator &owner, Group &group, std::string op,
           cudaEvent_t event, cudaStream_t orderOn, Staging staging)
      : owner(owner), group(group), op(std::move(op)), event(event),
        orderOn(orderOn), staging(std::move(staging)) {}
  ~NcclWork() override;
  Status wait() override;

private:
  NcclCommunicator &owner;
  Group &group;
  std::string op;
  cudaEvent_t event;
  cudaStream_t orderOn; // the bound stream that waits; null: the host
  Staging staging;
  bool waited = false;
  Status status;
};

class NcclCommunicator final : public Communicator {
public:
  NcclCommunicator(int rank, int worldSize, int device,
                   std::chrono::milliseconds timeout, const NcclLibrary &lib,
                   std::shared_ptr<gloo::rendezvous::Store> store)
      : myRank(rank), size(worldSize), device(device), timeout(timeout),
        lib(lib), store(std::move(store)) {}
  ~NcclCommunicator() override;

  int rank() const override { return myRank; }
  int worldSize() const override { return size; }

  Status connect(std::vector<CommKey> keys) override;
  void bindDeviceStream(const std::string &stream, void *deviceStream) override;
  void unbindDeviceStream(const std::string &stream,
                          void *deviceStream) override;
  CommWorkPtr isend(const std::string &stream, const void *data, size_t bytes,
                    int peer, uint32_t tag) override;
  CommWorkPtr irecv(const std::string &stream, void *data, size_t bytes,
                    int peer, uint32_t tag) override;
  CommWorkPtr allReduce(const CommKey &key, void *data, size_t count,
                        CommDType type) override;
  CommWorkPtr reduceScatter(const CommKey &key, const void *input, void *output,
                            const std::vector<size_t> &counts,
                            CommDType type) override;
  CommWorkPtr allGather(const CommKey &key, const void *input, void *output,
                        const std::vector<size_t> &counts,
                        CommDType type) override;
  CommWorkPtr allToAll(const CommKey &key, const void *input,
                       const std::vector<size_t> &sendCounts, void *output,
                       const std::vector<size_t> &recvCounts,
                       CommDType type) override;
  Status allReduceSumWorld(double *data, size_t count) override;
  Status allReduceSumWorldOn(const std::string &stream, double *data,
                             size_t count) override;
  /// Every operation of a bound stream is queued on it and waited for
  /// there: a step's collectives and sends are captured with its kernels
  /// (NCCL supports stream capture; the tails are not recorded into a
  /// capture, see launch()).
  std::string stepCaptureRefusal() const override { return ""; }

  // Errors and completion (NcclWork.cpp), shared with NcclWork.

  /// "rank R: <op> failed: <detail>".
  Status opError(const std::string &op, const std::string &detail) const;
  /// NCCL's message for `result` of `call`, with its last error's detail.
  std::string ncclMessage(ncclResult_t result, const char *call,
                          const char *file, int line) const;
  /// The error of `op` after an earlier failure of `group`.
  Status unusable(const std::string &op, const Group &group) const;
  /// Records `detail` as `group`'s failure and aborts its NCCL
  /// communicators, which ends its kernels still waiting for peers. Needs
  /// group.mu held.
  void poisonLocked(Group &group, const std::string &detail);
  /// The asynchronous error of `group`'s communicators, if any (then the
  /// group is poisoned).
  Status asyncError(Group &group, const std::string &op);
  /// Waits on the host until `event` completes, at most the timeout.
  Status hostWait(Group &group, cudaEvent_t event, const std::string &op);

private:
  // Setup (NcclCommunicator.cpp).

  /// Creates the NCCL communicator of `nranks` ranks where this one is
  /// `position`, meeting through the store under `prefix` (one rank:
  /// without the store).
  Status initComm(const std::string &prefix, int nranks, int position,
                  ncclComm_t &comm);
  Status setUpGroup(Group &group);
  /// One byte each way between a pair's peers, while both are connecting.
  Status firstExchange(Group &group, const std::string &op);
  Status findGroup(const CommKey &key, const std::string &op, Group *&group);
  Status pairGroup(const std::string &stream, int peer, const std::string &op,
                   Group *&group);
  /// Where operations of logical stream `stream` are issued (selecting the
  /// device on the calling thread).
  Status issueStream(const std::string &stream, IssueStream &issue);
  /// The group of collective `key` (with one count per member when
  /// `counts` is given) and where to issue it; on error, the error's work.
  CommWorkPtr prepareCollective(const CommKey &key, const std::string &op,
                                const std::vector<size_t> *counts,
                                Group *&group, IssueStream &issue);
  /// The same for a point-to-point operation with `peer` on `stream`.
  CommWorkPtr preparePair(const std::string &stream, int peer,
                          const std::string &op, Group *&group,
                          IssueStream &issue);

  // Operations (NcclCollectives.cpp).

  /// Reduce-scatter (`scatter`) or all-gather: the mirror images of one
  /// sliced collective.
  CommWorkPtr sliced(bool scatter, const CommKey &key, const void *input,
                     void *output, const std::vector<size_t> &counts,
                     CommDType type);

  // Issuing (NcclWork.cpp).

  /// Issues `body` (on `staging.stream`, staging host buffers) under the
  /// group's lock, then records the work's event on `eventStream` (the
  /// staging stream when null).
  CommWorkPtr launch(Group &group, const std::string &op,
                     const IssueStream &issue,
                     const std::function<Status(Staging &)> &body,
                     cudaStream_t eventStream = nullptr,
                     cudaEvent_t tail = nullptr);
  /// Issues a grouped set of NCCL calls: ncclGroupEnd even after an error.
  Status grouped(const std::function<Status()> &calls);
  /// Grouped: call(i, offset) for every member i with counts[i] > 0, where
  /// offset is the sum of the counts before it (collectives with unequal
  /// slices, one rooted operation per member).
  Status perMember(const std::vector<size_t> &counts,
                   const std::function<Status(int, size_t)> &call);
  Status check(ncclResult_t result, const char *call, const char *file,
               int line) const {
    if (result == ncclSuccess || result == ncclInProgress)
      return Status::ok();
    return Status::error(ncclMessage(result, call, file, line));
  }

  const int myRank;
  const int size;
  const int device;
  const std::chrono::milliseconds timeout;
  const NcclLibrary &lib;
  std::shared_ptr<gloo::rendezvous::Store> store;
  bool connected = false;
  /// Operations of unbound streams (the executor's loading thread).
  cudaStream_t hostStream = nullptr;
  std::mutex worldMutex;
  Group world;
  cudaStream_t worldStream = nullptr;
  /// Keyed by CommKey::str(); fixed after connect.
  std::map<std::string, std::unique_ptr<Group>> groups;
  /// Logical stream name -> its CUDA stream (bindDeviceStream).
  std::mutex boundMu;
  std::map<std::string, cudaStream_t> bound;
};

#define PIPER_NCCL_CHECK(call) check((call), #call, __FILE__, __LINE__)

} // namespace piper::runtime::hal::nccl

#endif // PIPER_RUNTIME_HAL_CUDA_NCCLINTERNAL_H
