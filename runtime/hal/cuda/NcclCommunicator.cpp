// The NCCL communicator (NcclCommunicator.h), its setup: creating it,
// connecting one NCCL communicator per key (two per pair) in sorted key
// order, binding logical streams to their CUDA streams, finding a key's
// group for an operation, and tearing down. Issuing and completion are in
// NcclWork.cpp, the operations in NcclCollectives.cpp and
// NcclPointToPoint.cpp.
#include "runtime/hal/cuda/NcclCommunicator.h"

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/cuda/NcclInternal.h"

namespace piper::runtime::hal {

namespace nccl {

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
  return firstExchange(group, op);
}

Status NcclCommunicator::firstExchange(Group &group, const std::string &op) {
  auto cuda = [&](cudaError_t err, const char *call) -> Status {
    if (err == cudaSuccess)
      return Status::ok();
    return opError(op, cudaErrorMessage(err, call, __FILE__, __LINE__));
  };
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

void NcclCommunicator::bindDeviceStream(const std::string &stream,
                                        void *deviceStream) {
  std::lock_guard<std::mutex> lock(boundMu);
  if (deviceStream)
    bound[stream] = static_cast<cudaStream_t>(deviceStream);
  else
    bound.erase(stream);
}

void NcclCommunicator::unbindDeviceStream(const std::string &stream,
                                          void *deviceStream) {
  std::lock_guard<std::mutex> lock(boundMu);
  auto it = bound.find(stream);
  if (it != bound.end() && it->second == deviceStream)
    bound.erase(it);
}

Status NcclCommunicator::issueStream(const std::string &stream,
                                     IssueStream &issue) {
  // Any thread may issue (a HAL stream's worker, or the executor's own for
  // checkpoints): select the device on it.
  PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  {
    std::lock_guard<std::mutex> lock(boundMu);
    auto it = bound.find(stream);
    if (it != bound.end()) {
      issue = {it->second, true};
      return Status::ok();
    }
  }
  if (!hostStream)
    return Status::error("the communicator is not connected");
  issue = {hostStream, false};
  return Status::ok();
}

CommWorkPtr NcclCommunicator::prepareCollective(
    const CommKey &key, const std::string &op,
    const std::vector<size_t> *counts, Group *&group, IssueStream &issue) {
  Status found = findGroup(key, op, group);
  if (found && counts && counts->size() != group->key.ranks.size())
    found = opError(op, fmt::format("{} counts for {} members", counts->size(),
                                    group->key.ranks.size()));
  if (found)
    found = issueStream(key.stream, issue);
  return found ? nullptr : completedWork(found);
}

CommWorkPtr NcclCommunicator::preparePair(const std::string &stream, int peer,
                                          const std::string &op, Group *&group,
                                          IssueStream &issue) {
  Status found = pairGroup(stream, peer, op, group);
  if (found)
    found = issueStream(stream, issue);
  return found ? nullptr : completedWork(found);
}

} // namespace nccl

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
  return std::make_unique<nccl::NcclCommunicator>(
      rank, worldSize, cudaDevice, timeout, *lib, std::move(store));
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
