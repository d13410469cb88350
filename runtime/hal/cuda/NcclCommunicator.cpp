// The NCCL communicator: see NcclCommunicator.h.
#include "runtime/hal/cuda/NcclCommunicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/cuda/NcclLibrary.h"

namespace piper::runtime::hal {

namespace {

using Clock = std::chrono::steady_clock;

/// Store prefix of the world control communicator; never equal to a key's
/// str(), which always ends in ']'.
constexpr const char *kWorld = "__world__";

ncclDataType_t ncclType(CommDType type) {
  switch (type) {
  case CommDType::F32:
    return ncclFloat32;
  case CommDType::BF16:
    return ncclBfloat16;
  case CommDType::I32:
    return ncclInt32;
  case CommDType::F64:
    return ncclFloat64;
  }
  return ncclFloat32;
}

std::string rankList(const std::vector<int> &ranks) {
  return CommKey{"", ranks}.str();
}

/// Whether `ptr` is host memory (pageable or pinned) rather than device
/// memory.
Status isHostMemory(const void *ptr, bool &host) {
  cudaPointerAttributes attr{};
  PIPER_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, ptr));
  host = attr.type == cudaMemoryTypeUnregistered ||
         attr.type == cudaMemoryTypeHost;
  return Status::ok();
}

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
  Status stage(void *&ptr, size_t bytes, bool copyIn, bool copyBack) {
    if (bytes == 0 || !ptr)
      return Status::ok();
    bool host = false;
    PIPER_RETURN_IF_ERROR(isHostMemory(ptr, host));
    if (!host)
      return Status::ok();
    void *device = nullptr;
    PIPER_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&device, bytes, stream));
    buffers.push_back({ptr, device, bytes, copyBack});
    if (copyIn)
      PIPER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          device, ptr, bytes, cudaMemcpyHostToDevice, stream));
    ptr = device;
    return Status::ok();
  }
  Status in(const void *&ptr, size_t bytes) {
    void *p = const_cast<void *>(ptr);
    PIPER_RETURN_IF_ERROR(stage(p, bytes, true, false));
    ptr = p;
    return Status::ok();
  }
  Status out(void *&ptr, size_t bytes) { return stage(ptr, bytes, false, true); }
  Status inOut(void *&ptr, size_t bytes) {
    return stage(ptr, bytes, true, true);
  }
  /// Copies the results back (when `copy`) and frees the device memory.
  Status finish(bool copy) {
    Status status;
    for (Buffer &b : buffers) {
      if (copy && b.copyBack && status.isOk()) {
        cudaError_t err = cudaMemcpyAsync(b.host, b.device, b.bytes,
                                          cudaMemcpyDeviceToHost, stream);
        if (err == cudaSuccess)
          err = cudaStreamSynchronize(stream);
        if (err != cudaSuccess)
          status = Status::error(cudaErrorMessage(
              err, "cudaMemcpyAsync(host, staged, bytes, D2H)", __FILE__,
              __LINE__));
      }
      cudaFreeAsync(b.device, stream);
    }
    buffers.clear();
    return status;
  }
};

class NcclCommunicator;

/// The completion of one operation: a CUDA event after it.
class NcclWork final : public CommWork {
public:
  NcclWork(NcclCommunicator &owner, Group &group, std::string op,
           cudaEvent_t event, Staging staging)
      : owner(owner), group(group), op(std::move(op)), event(event),
        staging(std::move(staging)) {}
  ~NcclWork() override {
    if (staging.any())
      (void)staging.finish(false);
    cudaEventDestroy(event);
  }
  Status wait() override;

private:
  NcclCommunicator &owner;
  Group &group;
  std::string op;
  cudaEvent_t event;
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

  Status opError(const std::string &op, const std::string &detail) const {
    return Status::error(
        fmt::format("rank {}: {} failed: {}", myRank, op, detail));
  }
  /// NCCL's message for `result` of `call`, with its last error's detail.
  std::string ncclMessage(ncclResult_t result, const char *call,
                          const char *file, int line) const {
    std::string msg =
        fmt::format("{}: {}", call, lib.ncclGetErrorString(result));
    const char *last = lib.ncclGetLastError(nullptr);
    if (last && *last)
      msg += fmt::format(" ({})", last);
    return msg + fmt::format(" ({}:{})", file, line);
  }
  /// The error of `op` after an earlier failure of `group`.
  Status unusable(const std::string &op, const Group &group) const {
    return opError(op, fmt::format("communicator '{}' is unusable after an "
                                   "earlier error: {}",
                                   group.key.str(), group.failure));
  }
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
  /// Creates the NCCL communicator of `nranks` ranks where this one is
  /// `position`, meeting through the store under `prefix` (one rank:
  /// without the store).
  Status initComm(const std::string &prefix, int nranks, int position,
                  ncclComm_t &comm);
  Status setUpGroup(Group &group);
  Status findGroup(const CommKey &key, const std::string &op, Group *&group);
  Status pairGroup(const std::string &stream, int peer, const std::string &op,
                   Group *&group);
  Status collectiveGroup(const CommKey &key, const std::string &op,
                         const std::vector<size_t> *counts, Group *&group);
  /// The CUDA stream operations of the calling thread go to (selecting the
  /// device on threads that are not a HAL stream's worker).
  Status callerStream(cudaStream_t &stream);
  /// Issues `body` (on `staging.stream`, staging host buffers) under the
  /// group's lock, then records the work's event on `eventStream` (the
  /// staging stream when null).
  CommWorkPtr launch(Group &group, const std::string &op, cudaStream_t stream,
                     const std::function<Status(Staging &)> &body,
                     cudaStream_t eventStream = nullptr,
                     cudaEvent_t tail = nullptr);
  /// Issues a grouped set of NCCL calls: ncclGroupEnd even after an error.
  Status grouped(const std::function<Status()> &calls);
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
  /// Off-stream operations (the executor's loading thread).
  cudaStream_t hostStream = nullptr;
  std::mutex worldMutex;
  Group world;
  cudaStream_t worldStream = nullptr;
  /// Keyed by CommKey::str(); fixed after connect.
  std::map<std::string, std::unique_ptr<Group>> groups;
};

#define PIPER_NCCL_CHECK(call) check((call), #call, __FILE__, __LINE__)

Status NcclWork::wait() {
  if (waited)
    return status;
  waited = true;
  cudaStream_t current = currentCudaStream();
  if (current && !staging.any()) {
    cudaError_t err = cudaStreamWaitEvent(current, event, 0);
    if (err != cudaSuccess)
      status = owner.opError(
          op, cudaErrorMessage(err, "cudaStreamWaitEvent(current, event)",
                               __FILE__, __LINE__));
    else
      status = owner.asyncError(group, op);
    return status;
  }
  status = owner.hostWait(group, event, op);
  if (staging.any()) {
    Status copied = staging.finish(status.isOk());
    if (status.isOk() && !copied.isOk())
      status = owner.opError(op, copied.message());
  }
  return status;
}

void NcclCommunicator::poisonLocked(Group &group, const std::string &detail) {
  if (group.failure.empty())
    group.failure = detail;
  if (group.aborted)
    return;
  group.aborted = true;
  for (ncclComm_t *comm : {&group.comm, &group.reverse}) {
    if (*comm)
      lib.ncclCommAbort(*comm);
    *comm = nullptr;
  }
}

Status NcclCommunicator::asyncError(Group &group, const std::string &op) {
  std::lock_guard<std::mutex> lock(group.mu);
  if (!group.failure.empty())
    return unusable(op, group);
  for (ncclComm_t comm : {group.comm, group.reverse}) {
    if (!comm)
      continue;
    ncclResult_t async = ncclSuccess;
    ncclResult_t got = lib.ncclCommGetAsyncError(comm, &async);
    if (got != ncclSuccess)
      async = got;
    if (async != ncclSuccess && async != ncclInProgress) {
      std::string detail =
          ncclMessage(async, "ncclCommGetAsyncError", __FILE__, __LINE__);
      poisonLocked(group, detail);
      return opError(op, detail);
    }
  }
  return Status::ok();
}

Status NcclCommunicator::hostWait(Group &group, cudaEvent_t event,
                                  const std::string &op) {
  auto start = Clock::now();
  for (int spin = 0;; ++spin) {
    cudaError_t err = cudaEventQuery(event);
    if (err == cudaSuccess)
      break;
    if (err != cudaErrorNotReady)
      return opError(op, cudaErrorMessage(err, "cudaEventQuery(event)",
                                          __FILE__, __LINE__));
    PIPER_RETURN_IF_ERROR(asyncError(group, op));
    if (Clock::now() - start > timeout) {
      std::string detail = fmt::format(
          "no completion after {} ms: a member of {} did not take part; the "
          "NCCL communicator was aborted",
          timeout.count(), rankList(group.key.ranks));
      std::lock_guard<std::mutex> lock(group.mu);
      poisonLocked(group, detail);
      return opError(op, detail);
    }
    if (spin < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return asyncError(group, op);
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device);
  std::vector<Group *> all{&world};
  for (auto &[name, group] : groups)
    all.push_back(group.get());
  // A group whose last operation has not completed within the timeout (a
  // failed run: a peer never came) is aborted; the others are destroyed.
  // Healthy runs have completed everything (the device synchronized its
  // streams): a short grace is enough.
  auto grace = std::min<std::chrono::milliseconds>(
      timeout, std::chrono::milliseconds(2000));
  auto start = Clock::now();
  for (Group *group : all) {
    std::lock_guard<std::mutex> lock(group->mu);
    for (cudaEvent_t tail : {group->tail, group->sendTail}) {
      if (!tail || group->aborted)
        continue;
      while (cudaEventQuery(tail) == cudaErrorNotReady &&
             Clock::now() - start < grace)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (cudaEventQuery(tail) != cudaSuccess)
        poisonLocked(*group, "destroyed with operations in flight");
    }
    for (ncclComm_t comm : {group->comm, group->reverse})
      if (comm)
        lib.ncclCommDestroy(comm);
    group->comm = group->reverse = nullptr;
    for (cudaEvent_t event : {group->ready, group->tail, group->sendTail})
      if (event)
        cudaEventDestroy(event);
    if (group->sendStream)
      cudaStreamDestroy(group->sendStream);
  }
  if (hostStream)
    cudaStreamDestroy(hostStream);
  if (worldStream)
    cudaStreamDestroy(worldStream);
}

Status NcclCommunicator::initComm(const std::string &prefix, int nranks,
                                  int position, ncclComm_t &comm) {
  std::string op = fmt::format("connecting communicator '{}'", prefix);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (position == 0) {
    Status got =
        PIPER_NCCL_CHECK(lib.ncclGetUniqueId(&id)).withContext("unique id");
    if (!got)
      return opError(op, got.message());
  }
  if (nranks > 1) {
    try {
      gloo::rendezvous::PrefixStore prefixed(std::string("nccl:") + prefix,
                                             *store);
      if (position == 0) {
        prefixed.set("id", std::vector<char>(id.internal,
                                             id.internal + sizeof id.internal));
      } else {
        prefixed.wait({"id"}, timeout);
        std::vector<char> value = prefixed.get("id");
        if (value.size() != sizeof id.internal)
          return opError(op, fmt::format("the unique id in the store has {} "
                                         "bytes, not {}",
                                         value.size(), sizeof id.internal));
        std::memcpy(id.internal, value.data(), value.size());
      }
    } catch (const std::exception &e) {
      return opError(op, fmt::format("the rendezvous store: {}", e.what()));
    }
  }
  ncclResult_t result = lib.ncclCommInitRank(&comm, nranks, id, position);
  if (result != ncclSuccess) {
    comm = nullptr;
    std::string detail =
        ncclMessage(result, "ncclCommInitRank(&comm, nranks, id, position)",
                    __FILE__, __LINE__);
    // NCCL refuses two ranks of one communicator on one GPU ("Duplicate
    // GPU detected").
    if (result == ncclInvalidUsage)
      detail += "; NCCL needs one GPU per rank (ranks sharing a GPU use "
                "--comm gloo)";
    return opError(op, detail);
  }
  return Status::ok();
}

Status NcclCommunicator::setUpGroup(Group &group) {
  const std::string name = group.key.str();
  PIPER_RETURN_IF_ERROR(
      initComm(group.pair() ? name + "/up" : name, group.size(),
               group.position, group.comm));
  std::string op = fmt::format("connecting communicator '{}'", name);
  auto cuda = [&](cudaError_t err, const char *call) -> Status {
    if (err == cudaSuccess)
      return Status::ok();
    return opError(op, cudaErrorMessage(err, call, __FILE__, __LINE__));
  };
  PIPER_RETURN_IF_ERROR(
      cuda(cudaEventCreateWithFlags(&group.tail, cudaEventDisableTiming),
           "cudaEventCreateWithFlags(&tail)"));
  if (!group.pair())
    return Status::ok();
  PIPER_RETURN_IF_ERROR(
      initComm(name + "/down", 2, group.position, group.reverse));
  PIPER_RETURN_IF_ERROR(cuda(
      cudaStreamCreateWithFlags(&group.sendStream, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags(&sendStream)"));
  PIPER_RETURN_IF_ERROR(
      cuda(cudaEventCreateWithFlags(&group.ready, cudaEventDisableTiming),
           "cudaEventCreateWithFlags(&ready)"));
  PIPER_RETURN_IF_ERROR(
      cuda(cudaEventCreateWithFlags(&group.sendTail, cudaEventDisableTiming),
           "cudaEventCreateWithFlags(&sendTail)"));
  // NCCL connects a pair's peers on their first send/receive, blocking the
  // host until the peer connects too: two ranks whose first operations are
  // both sends (each waiting for the other's receive to connect) would
  // never get there. One byte each way now, while both are here.
  char *probe = nullptr;
  PIPER_RETURN_IF_ERROR(cuda(cudaMalloc(&probe, 2), "cudaMalloc(&probe, 2)"));
  cudaEvent_t done = nullptr;
  Status exchanged = [&]() -> Status {
    const int peer = 1 - group.position;
    for (ncclComm_t comm : {group.comm, group.reverse}) {
      bool sends = comm == group.sendComm();
      Status st = grouped([&]() -> Status {
        return sends ? PIPER_NCCL_CHECK(lib.ncclSend(probe, 1, ncclInt8, peer,
                                                     comm, hostStream))
                     : PIPER_NCCL_CHECK(lib.ncclRecv(probe + 1, 1, ncclInt8,
                                                     peer, comm, hostStream));
      });
      if (!st)
        return opError(op, st.message());
    }
    PIPER_RETURN_IF_ERROR(
        cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
             "cudaEventCreateWithFlags(&done)"));
    PIPER_RETURN_IF_ERROR(
        cuda(cudaEventRecord(done, hostStream), "cudaEventRecord(done)"));
    return hostWait(group, done, op + " (first exchange)");
  }();
  if (done)
    cudaEventDestroy(done);
  if (exchanged)
    cudaFree(probe); // synchronizes: complete anyway
  return exchanged;
}

Status NcclCommunicator::connect(std::vector<CommKey> keys) {
  if (connected)
    return opError("connect", "the communicator is already connected");
  std::map<std::string, CommKey> sortedKeys;
  for (CommKey &key : keys) {
    PIPER_RETURN_IF_ERROR(normalizeCommKey(key, myRank, size));
    sortedKeys.emplace(key.str(), std::move(key));
  }
  connected = true;
  PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  PIPER_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&hostStream, cudaStreamNonBlocking));
  PIPER_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&worldStream, cudaStreamNonBlocking));

  world.key.stream = kWorld;
  for (int r = 0; r < size; ++r)
    world.key.ranks.push_back(r);
  world.position = myRank;
  if (size > 1) {
    PIPER_RETURN_IF_ERROR(initComm(kWorld, size, myRank, world.comm));
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&world.tail, cudaEventDisableTiming));
  }

  for (auto &[name, key] : sortedKeys) {
    auto group = std::make_unique<Group>();
    group->key = std::move(key);
    group->position = static_cast<int>(
        std::lower_bound(group->key.ranks.begin(), group->key.ranks.end(),
                         myRank) -
        group->key.ranks.begin());
    Group &g = *group;
    groups.emplace(name, std::move(group));
    // A one-rank key meets no one: its communicator comes on first use.
    if (g.size() > 1)
      PIPER_RETURN_IF_ERROR(setUpGroup(g));
  }
  return Status::ok();
}

Status NcclCommunicator::findGroup(const CommKey &key, const std::string &op,
                                   Group *&group) {
  auto it = groups.find(key.str());
  if (it == groups.end())
    return opError(
        op, fmt::format("no communicator connected for key '{}'", key.str()));
  group = it->second.get();
  std::lock_guard<std::mutex> lock(group->mu);
  if (!group->failure.empty())
    return unusable(op, *group);
  if (group->size() == 1 && !group->comm) {
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    Status made = [&]() -> Status {
      PIPER_RETURN_IF_ERROR(initComm(group->key.str(), 1, 0, group->comm));
      PIPER_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(&group->tail, cudaEventDisableTiming));
      return Status::ok();
    }();
    if (!made) {
      group->failure = made.message();
      return made;
    }
  }
  return Status::ok();
}

Status NcclCommunicator::pairGroup(const std::string &stream, int peer,
                                   const std::string &op, Group *&group) {
  if (peer < 0 || peer >= size)
    return opError(
        op, fmt::format("the peer is outside the world of {} ranks", size));
  if (peer == myRank)
    return opError(op, "the peer is this rank");
  return findGroup(
      CommKey{stream, {std::min(myRank, peer), std::max(myRank, peer)}}, op,
      group);
}

Status NcclCommunicator::collectiveGroup(const CommKey &key,
                                         const std::string &op,
                                         const std::vector<size_t> *counts,
                                         Group *&group) {
  PIPER_RETURN_IF_ERROR(findGroup(key, op, group));
  if (counts && counts->size() != group->key.ranks.size())
    return opError(op, fmt::format("{} counts for {} members", counts->size(),
                                   group->key.ranks.size()));
  return Status::ok();
}

Status NcclCommunicator::callerStream(cudaStream_t &stream) {
  stream = currentCudaStream();
  if (stream)
    return Status::ok();
  if (!hostStream)
    return Status::error("the communicator is not connected");
  PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  stream = hostStream;
  return Status::ok();
}

Status NcclCommunicator::grouped(const std::function<Status()> &calls) {
  PIPER_RETURN_IF_ERROR(PIPER_NCCL_CHECK(lib.ncclGroupStart()));
  Status issued = calls();
  Status ended = PIPER_NCCL_CHECK(lib.ncclGroupEnd());
  return issued.isOk() ? ended : issued;
}

CommWorkPtr NcclCommunicator::launch(
    Group &group, const std::string &op, cudaStream_t stream,
    const std::function<Status(Staging &)> &body, cudaStream_t eventStream,
    cudaEvent_t tail) {
  Staging staging;
  staging.stream = stream;
  std::lock_guard<std::mutex> lock(group.mu);
  if (!group.failure.empty())
    return completedWork(unusable(op, group));
  cudaEvent_t event = nullptr;
  Status issued = [&]() -> Status {
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    PIPER_RETURN_IF_ERROR(body(staging));
    cudaStream_t on = eventStream ? eventStream : stream;
    PIPER_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, on));
    cudaEvent_t last = tail ? tail : group.tail;
    if (last)
      PIPER_CUDA_RETURN_IF_ERROR(cudaEventRecord(last, on));
    return Status::ok();
  }();
  if (!issued) {
    if (event)
      cudaEventDestroy(event);
    (void)staging.finish(false);
    return completedWork(opError(op, issued.message()));
  }
  return std::make_shared<NcclWork>(*this, group, op, event,
                                    std::move(staging));
}

CommWorkPtr NcclCommunicator::isend(const std::string &stream, const void *data,
                                   size_t bytes, int peer, uint32_t) {
  std::string op = fmt::format("send to rank {} on stream '{}'", peer, stream);
  Group *g = nullptr;
  cudaStream_t caller = nullptr;
  Status found = pairGroup(stream, peer, op, g);
  if (found)
    found = callerStream(caller);
  if (!found)
    return completedWork(found);
  int peerPosition = 1 - g->position;
  return launch(
      *g, op, caller,
      [&](Staging &staging) -> Status {
        PIPER_RETURN_IF_ERROR(staging.in(data, bytes));
        // The send runs on the pair's send stream once its data are ready
        // on the caller's stream; the staging memory is freed there.
        PIPER_CUDA_RETURN_IF_ERROR(cudaEventRecord(g->ready, caller));
        PIPER_CUDA_RETURN_IF_ERROR(
            cudaStreamWaitEvent(g->sendStream, g->ready, 0));
        staging.stream = g->sendStream;
        return PIPER_NCCL_CHECK(lib.ncclSend(data, bytes, ncclInt8,
                                             peerPosition, g->sendComm(),
                                             g->sendStream));
      },
      g->sendStream, g->sendTail);
}

CommWorkPtr NcclCommunicator::irecv(const std::string &stream, void *data,
                                    size_t bytes, int peer, uint32_t) {
  std::string op =
      fmt::format("recv from rank {} on stream '{}'", peer, stream);
  Group *g = nullptr;
  cudaStream_t caller = nullptr;
  Status found = pairGroup(stream, peer, op, g);
  if (found)
    found = callerStream(caller);
  if (!found)
    return completedWork(found);
  int peerPosition = 1 - g->position;
  return launch(*g, op, caller, [&](Staging &staging) -> Status {
    PIPER_RETURN_IF_ERROR(staging.out(data, bytes));
    return PIPER_NCCL_CHECK(lib.ncclRecv(data, bytes, ncclInt8, peerPosition,
                                         g->recvComm(), caller));
  });
}

namespace {
std::string describe(const char *what, const CommKey &key) {
  return fmt::format("{} over ranks {} on stream '{}'", what,
                     rankList(key.ranks), key.stream);
}
bool allEqual(const std::vector<size_t> &counts) {
  return std::adjacent_find(counts.begin(), counts.end(),
                            std::not_equal_to<size_t>()) == counts.end();
}
} // namespace

CommWorkPtr NcclCommunicator::allReduce(const CommKey &key, void *data,
                                        size_t count, CommDType type) {
  std::string op = describe("all-reduce", key);
  Group *g = nullptr;
  cudaStream_t stream = nullptr;
  Status found = collectiveGroup(key, op, nullptr, g);
  if (found)
    found = callerStream(stream);
  if (!found)
    return completedWork(found);
  size_t bytes = count * commDTypeSize(type);
  return launch(*g, op, stream, [&](Staging &staging) -> Status {
    PIPER_RETURN_IF_ERROR(staging.inOut(data, bytes));
    return PIPER_NCCL_CHECK(lib.ncclAllReduce(data, data, count,
                                              ncclType(type), ncclSum, g->comm,
                                              stream));
  });
}

CommWorkPtr NcclCommunicator::reduceScatter(const CommKey &key,
                                            const void *input, void *output,
                                            const std::vector<size_t> &counts,
                                            CommDType type) {
  std::string op = describe("reduce-scatter", key);
  Group *g = nullptr;
  cudaStream_t stream = nullptr;
  Status found = collectiveGroup(key, op, &counts, g);
  if (found)
    found = callerStream(stream);
  if (!found)
    return completedWork(found);
  const size_t elem = commDTypeSize(type);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t mine = counts[g->position];
  return launch(*g, op, stream, [&](Staging &staging) -> Status {
    PIPER_RETURN_IF_ERROR(staging.in(input, total * elem));
    PIPER_RETURN_IF_ERROR(staging.out(output, mine * elem));
    if (allEqual(counts))
      return PIPER_NCCL_CHECK(lib.ncclReduceScatter(input, output, mine,
                                                    ncclType(type), ncclSum,
                                                    g->comm, stream));
    // Unequal slices: one reduce per member, rooted at it.
    return grouped([&]() -> Status {
      size_t offset = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        const char *slice = static_cast<const char *>(input) + offset * elem;
        offset += counts[i];
        if (counts[i] == 0)
          continue;
        // recvbuff is only written on the root.
        void *recv = static_cast<int>(i) == g->position
                         ? output
                         : const_cast<char *>(slice);
        PIPER_RETURN_IF_ERROR(PIPER_NCCL_CHECK(
            lib.ncclReduce(slice, recv, counts[i], ncclType(type), ncclSum,
                           static_cast<int>(i), g->comm, stream)));
      }
      return Status::ok();
    });
  });
}

CommWorkPtr NcclCommunicator::allGather(const CommKey &key, const void *input,
                                        void *output,
                                        const std::vector<size_t> &counts,
                                        CommDType type) {
  std::string op = describe("all-gather", key);
  Group *g = nullptr;
  cudaStream_t stream = nullptr;
  Status found = collectiveGroup(key, op, &counts, g);
  if (found)
    found = callerStream(stream);
  if (!found)
    return completedWork(found);
  const size_t elem = commDTypeSize(type);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t mine = counts[g->position];
  return launch(*g, op, stream, [&](Staging &staging) -> Status {
    PIPER_RETURN_IF_ERROR(staging.in(input, mine * elem));
    PIPER_RETURN_IF_ERROR(staging.out(output, total * elem));
    if (allEqual(counts))
      return PIPER_NCCL_CHECK(lib.ncclAllGather(input, output, mine,
                                                ncclType(type), g->comm,
                                                stream));
    // Unequal slices: one broadcast per member, rooted at it.
    return grouped([&]() -> Status {
      size_t offset = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        char *slice = static_cast<char *>(output) + offset * elem;
        offset += counts[i];
        if (counts[i] == 0)
          continue;
        const void *send =
            static_cast<int>(i) == g->position ? input : slice;
        PIPER_RETURN_IF_ERROR(PIPER_NCCL_CHECK(
            lib.ncclBroadcast(send, slice, counts[i], ncclType(type),
                              static_cast<int>(i), g->comm, stream)));
      }
      return Status::ok();
    });
  });
}

CommWorkPtr NcclCommunicator::allToAll(const CommKey &key, const void *input,
                                       const std::vector<size_t> &sendCounts,
                                       void *output,
                                       const std::vector<size_t> &recvCounts,
                                       CommDType type) {
  std::string op = describe("all-to-all", key);
  Group *g = nullptr;
  cudaStream_t stream = nullptr;
  Status found = collectiveGroup(key, op, &sendCounts, g);
  if (found && recvCounts.size() != sendCounts.size())
    found = opError(op, fmt::format("{} receive counts for {} members",
                                    recvCounts.size(), sendCounts.size()));
  if (found)
    found = callerStream(stream);
  if (!found)
    return completedWork(found);
  const size_t elem = commDTypeSize(type);
  const int me = g->position;
  return launch(*g, op, stream, [&](Staging &staging) -> Status {
    size_t sendTotal =
        std::accumulate(sendCounts.begin(), sendCounts.end(), size_t{0});
    size_t recvTotal =
        std::accumulate(recvCounts.begin(), recvCounts.end(), size_t{0});
    PIPER_RETURN_IF_ERROR(staging.in(input, sendTotal * elem));
    PIPER_RETURN_IF_ERROR(staging.out(output, recvTotal * elem));
    std::vector<size_t> sendOffset(sendCounts.size()),
        recvOffset(recvCounts.size());
    for (size_t i = 1; i < sendCounts.size(); ++i) {
      sendOffset[i] = sendOffset[i - 1] + sendCounts[i - 1];
      recvOffset[i] = recvOffset[i - 1] + recvCounts[i - 1];
    }
    if (sendCounts[me] != recvCounts[me])
      return Status::error(fmt::format(
          "this rank sends itself {} elements but expects {}", sendCounts[me],
          recvCounts[me]));
    if (sendCounts[me] > 0)
      PIPER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          static_cast<char *>(output) + recvOffset[me] * elem,
          static_cast<const char *>(input) + sendOffset[me] * elem,
          sendCounts[me] * elem, cudaMemcpyDeviceToDevice, stream));
    if (g->size() == 1)
      return Status::ok();
    return grouped([&]() -> Status {
      for (int i = 0; i < g->size(); ++i) {
        if (i == me)
          continue;
        if (sendCounts[i] > 0)
          PIPER_RETURN_IF_ERROR(PIPER_NCCL_CHECK(lib.ncclSend(
              static_cast<const char *>(input) + sendOffset[i] * elem,
              sendCounts[i], ncclType(type), i, g->comm, stream)));
        if (recvCounts[i] > 0)
          PIPER_RETURN_IF_ERROR(PIPER_NCCL_CHECK(lib.ncclRecv(
              static_cast<char *>(output) + recvOffset[i] * elem,
              recvCounts[i], ncclType(type), i, g->comm, stream)));
      }
      return Status::ok();
    });
  });
}

Status NcclCommunicator::allReduceSumWorld(double *data, size_t count) {
  if (size == 1 || count == 0)
    return Status::ok();
  std::lock_guard<std::mutex> serial(worldMutex);
  std::string op = "sum over all ranks";
  if (!world.comm && world.failure.empty())
    return opError(op, "the communicator is not connected");
  PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CommWorkPtr work =
      launch(world, op, worldStream, [&](Staging &staging) -> Status {
        void *buffer = data;
        PIPER_RETURN_IF_ERROR(staging.inOut(buffer, count * sizeof(double)));
        return PIPER_NCCL_CHECK(lib.ncclAllReduce(buffer, buffer, count,
                                                  ncclFloat64, ncclSum,
                                                  world.comm, worldStream));
      });
  return work->wait();
}

} // namespace

std::unique_ptr<Communicator>
createNcclCommunicator(int rank, int worldSize, int cudaDevice,
                       std::shared_ptr<gloo::rendezvous::Store> store,
                       std::chrono::milliseconds timeout, Status &status) {
  std::string what = fmt::format(
      "rank {}: creating the NCCL communicator failed: ", rank);
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    status = Status::error(
        what + fmt::format("rank outside the world of {} ranks", worldSize));
    return nullptr;
  }
  if (timeout <= std::chrono::milliseconds::zero()) {
    status = Status::error(what + "the timeout must be positive");
    return nullptr;
  }
  if (!store && worldSize > 1) {
    status = Status::error(what + "no rendezvous store");
    return nullptr;
  }
  const NcclLibrary *lib = nullptr;
  status = ncclLibrary(lib);
  if (!status) {
    status = Status::error(what + status.message());
    return nullptr;
  }
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess) {
    status = Status::error(
        what + cudaErrorMessage(err, "cudaGetDeviceCount(&devices)", __FILE__,
                                __LINE__));
    return nullptr;
  }
  if (cudaDevice < 0 || cudaDevice >= devices) {
    status = Status::error(what + fmt::format(
                                      "CUDA device {} does not exist ({} "
                                      "visible)",
                                      cudaDevice, devices));
    return nullptr;
  }
  status = Status::ok();
  return std::make_unique<NcclCommunicator>(rank, worldSize, cudaDevice,
                                            timeout, *lib, std::move(store));
}

std::unique_ptr<Communicator>
createNcclCommunicator(int rank, int worldSize, int cudaDevice,
                       const std::string &storeDir,
                       std::chrono::milliseconds timeout, Status &status) {
  std::error_code ec;
  if (!std::filesystem::is_directory(storeDir, ec)) {
    status = Status::error(fmt::format(
        "rank {}: creating the NCCL communicator failed: store directory "
        "'{}' does not exist",
        rank, storeDir));
    return nullptr;
  }
  std::shared_ptr<gloo::rendezvous::Store> store;
  try {
    store = std::make_shared<gloo::rendezvous::FileStore>(storeDir);
  } catch (const std::exception &e) {
    status = Status::error(fmt::format(
        "rank {}: creating the NCCL communicator failed: store directory "
        "'{}': {}",
        rank, storeDir, e.what()));
    return nullptr;
  }
  return createNcclCommunicator(rank, worldSize, cudaDevice, std::move(store),
                                timeout, status);
}

} // namespace piper::runtime::hal
