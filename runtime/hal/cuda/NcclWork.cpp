// The NCCL communicator's issuing and completion (NcclInternal.h): every
// operation runs under its group's lock and records a CUDA event; a work
// waits for that event on its bound stream or on the host (at most the
// timeout, then the group is aborted); host buffers are staged through
// temporary device memory; NCCL's asynchronous errors poison the group.
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/cuda/NcclInternal.h"

namespace piper::runtime::hal::nccl {

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

namespace {

/// Whether `ptr` is host memory (pageable or pinned) rather than device
/// memory.
Status isHostMemory(const void *ptr, bool &host) {
  cudaPointerAttributes attr{};
  PIPER_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, ptr));
  host = attr.type == cudaMemoryTypeUnregistered ||
         attr.type == cudaMemoryTypeHost;
  return Status::ok();
}

} // namespace

// --- staging ------------------------------------------------------------------

Status Staging::stage(void *&ptr, size_t bytes, bool copyIn, bool copyBack) {
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
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device, ptr, bytes, cudaMemcpyHostToDevice, stream));
  ptr = device;
  return Status::ok();
}

Status Staging::in(const void *&ptr, size_t bytes) {
  void *p = const_cast<void *>(ptr);
  PIPER_RETURN_IF_ERROR(stage(p, bytes, true, false));
  ptr = p;
  return Status::ok();
}

Status Staging::finish(bool copy) {
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

// --- works --------------------------------------------------------------------

NcclWork::~NcclWork() {
  if (staging.any())
    (void)staging.finish(false);
  cudaEventDestroy(event);
}

Status NcclWork::wait() {
  if (waited)
    return status;
  waited = true;
  if (orderOn && !staging.any()) {
    // The GPU waits: later work of the bound stream runs after the
    // operation.
    cudaError_t err = cudaStreamWaitEvent(orderOn, event, 0);
    if (err != cudaSuccess)
      status = owner.opError(
          op, cudaErrorMessage(err, "cudaStreamWaitEvent(stream, event)",
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

// --- errors -------------------------------------------------------------------

Status NcclCommunicator::opError(const std::string &op,
                                 const std::string &detail) const {
  return Status::error(
      fmt::format("rank {}: {} failed: {}", myRank, op, detail));
}

std::string NcclCommunicator::ncclMessage(ncclResult_t result,
                                          const char *call, const char *file,
                                          int line) const {
  std::string msg = fmt::format("{}: {}", call, lib.ncclGetErrorString(result));
  const char *last = lib.ncclGetLastError(nullptr);
  if (last && *last)
    msg += fmt::format(" ({})", last);
  return msg + fmt::format(" ({}:{})", file, line);
}

Status NcclCommunicator::unusable(const std::string &op,
                                  const Group &group) const {
  return opError(op, fmt::format("communicator '{}' is unusable after an "
                                 "earlier error: {}",
                                 group.key.str(), group.failure));
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

// --- issuing ------------------------------------------------------------------

Status NcclCommunicator::grouped(const std::function<Status()> &calls) {
  PIPER_RETURN_IF_ERROR(PIPER_NCCL_CHECK(lib.ncclGroupStart()));
  Status issued = calls();
  Status ended = PIPER_NCCL_CHECK(lib.ncclGroupEnd());
  return issued.isOk() ? ended : issued;
}

Status NcclCommunicator::perMember(
    const std::vector<size_t> &counts,
    const std::function<Status(int, size_t)> &call) {
  return grouped([&]() -> Status {
    size_t offset = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      if (counts[i] > 0)
        PIPER_RETURN_IF_ERROR(call(static_cast<int>(i), offset));
      offset += counts[i];
    }
    return Status::ok();
  });
}

CommWorkPtr NcclCommunicator::launch(
    Group &group, const std::string &op, const IssueStream &issue,
    const std::function<Status(Staging &)> &body, cudaStream_t eventStream,
    cudaEvent_t tail) {
  Staging staging;
  staging.stream = issue.stream;
  std::lock_guard<std::mutex> lock(group.mu);
  if (!group.failure.empty())
    return completedWork(unusable(op, group));
  cudaEvent_t event = nullptr;
  Status issued = [&]() -> Status {
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    PIPER_RETURN_IF_ERROR(body(staging));
    cudaStream_t on = eventStream ? eventStream : issue.stream;
    PIPER_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, on));
    // The tail tells the destructor whether work is in flight; an event
    // last recorded in a capture cannot be queried (cudaErrorCapturedEvent),
    // and a captured step's launches are waited for by the device's own
    // synchronization before the communicator is destroyed.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    PIPER_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(on, &capturing));
    cudaEvent_t last = tail ? tail : group.tail;
    if (last && capturing == cudaStreamCaptureStatusNone)
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
                                    issue.bound ? issue.stream : nullptr,
                                    std::move(staging));
}

} // namespace piper::runtime::hal::nccl
