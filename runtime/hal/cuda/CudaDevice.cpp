// The CUDA backend of the HAL (see CudaBackend.h): device memory from plain
// cudaMalloc, one CUDA stream per logical stream, CUDA events between
// streams, host <-> device copies, and the GPU kernel layer
// (runtime/hal/gpu) with its CUDA primitives (CudaApi.cpp).
//
// Streams. The executor enqueues host functions on a Stream; here each
// stream keeps a host worker thread (as the CPU backend does) that owns a
// non-blocking cudaStream_t and runs the functions in order. While a
// function runs, the thread's current CUDA stream is that stream, so the
// device work it issues (copies, memsets, later kernels) is queued on it
// asynchronously; synchronize() drains the host queue, then the CUDA
// stream. Work issued from any other thread (the executor's loading,
// checkpoints) runs on the device's own host stream and is complete when
// the call returns, as on the CPU. Each stream is bound by name to the
// device's communicator (Communicator::bindDeviceStream): NCCL issues the
// stream's communication on its CUDA stream, passed explicitly.
//
// Events. signal(v) on a stream records a CUDA event on that stream, then
// publishes v to host waiters; wait(v) on a stream blocks the host thread
// only until the record for v has been issued, then makes the CUDA stream
// wait for it (cudaStreamWaitEvent): the GPU does the waiting. One CUDA
// event per Event: a waiter that comes after a later signal waits for that
// later record, never for less. The executor signals value t once in step
// t and synchronizes every stream at the end of a step, so that later
// record never depends on the waiter.
//
// Errors. Every method that can fail returns a Status naming the CUDA call,
// its error and where it was made (cudaErrorMessage); nothing here ends the
// process: a CUDA error becomes the failure of the stream that met it, which
// the executor reports as the rank's failure (and the watchdog names).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "fmt/core.h"
#include "runtime/hal/HostWorker.h"
#include "runtime/hal/cuda/CudaBackend.h"
#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/cuda/CudaKernelContext.h"
#include "runtime/hal/cuda/CudaStepGraph.h"
#include "runtime/hal/cuda/CudaSums.h"
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"

namespace piper::runtime::hal {

std::string cudaErrorMessage(cudaError_t error, const char *call,
                             const char *file, int line) {
  return fmt::format("{}: {}: {} ({}:{})", call, cudaGetErrorName(error),
                     cudaGetErrorString(error), file, line);
}

bool isAsynchronousKernelError(cudaError_t error) {
  switch (error) {
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchTimeout:
  case cudaErrorAssert:
  case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace:
  case cudaErrorInvalidPc:
  case cudaErrorLaunchFailure:
    return true;
  default:
    return false;
  }
}

Status cudaCallError(cudaError_t error, const char *call, const char *file,
                     int line, const char *lastKernel) {
  std::string message = cudaErrorMessage(error, call, file, line);
  if (lastKernel && isAsynchronousKernelError(error))
    message += fmt::format("; the last kernel launched on this stream was "
                           "'{}' (CUDA_LAUNCH_BLOCKING=1 names the one that "
                           "faulted)",
                           lastKernel);
  return Status::error(message);
}

namespace {

/// The CUDA stream of the Stream whose worker runs on this thread; null on
/// other threads.
thread_local cudaStream_t currentStream = nullptr;
/// The GPU kernels' resources of that Stream.
thread_local CudaKernelResources *currentResources = nullptr;
/// The last kernel launched from this thread, and on a Stream's worker
/// that Stream's copy of it (read by synchronize() on another thread).
thread_local const char *threadLastKernel = nullptr;
thread_local std::atomic<const char *> *streamLastKernel = nullptr;
/// On a Stream's worker while its device captures a step: the capture's
/// number (from 1); 0 otherwise.
thread_local uint64_t currentCapture = 0;
std::atomic<uint64_t> capturesBegun{0};

/// The device memory: plain cudaMalloc per allocation (the executor makes
/// exactly one, the plan's arena), never managed memory.
class CudaAllocator final : public Allocator {
public:
  CudaAllocator(int ordinal, cudaStream_t hostStream)
      : ordinal(ordinal), hostStream(hostStream) {}

  Status allocate(size_t bytes, void *&ptr) override {
    ptr = nullptr;
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    cudaError_t err = cudaMalloc(&ptr, bytes == 0 ? 1 : bytes);
    if (err != cudaSuccess) {
      ptr = nullptr;
      (void)cudaGetLastError(); // out of memory is not sticky: clear it
      return Status::error(cudaErrorMessage(
          err, fmt::format("cudaMalloc(&ptr, {} bytes)", bytes).c_str(),
          __FILE__, __LINE__));
    }
    int64_t now = live.fetch_add(static_cast<int64_t>(bytes)) +
                  static_cast<int64_t>(bytes);
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    return Status::ok(); // 256-byte aligned
  }
  void deallocate(void *ptr, size_t bytes) override {
    if (!ptr)
      return;
    // An error here is a sticky one, which the call that met it first has
    // reported (see Allocator::deallocate).
    (void)cudaFree(ptr);
    live.fetch_sub(static_cast<int64_t>(bytes));
  }
  Status zero(void *ptr, size_t bytes) override {
    PIPER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr, 0, bytes, stream()));
    return finishIfHost();
  }
  Status copy(void *dst, const void *src, size_t bytes) override {
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
    return finishIfHost();
  }
  // Host memory is readable (or reusable) when these return: both wait for
  // their copy, on the calling stream.
  Status copyToHost(void *host, const void *src, size_t bytes) override {
    // cudaMemcpyDefault: callers (the staging communicator) may pass host
    // memory as `src` too.
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, src, bytes, cudaMemcpyDefault, stream()));
    PIPER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
    return Status::ok();
  }
  Status copyFromHost(void *dst, const void *host, size_t bytes) override {
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, host, bytes, cudaMemcpyDefault, stream()));
    PIPER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream()));
    return Status::ok();
  }
  Status allocateHost(size_t bytes, void *&ptr) override {
    ptr = nullptr;
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    cudaError_t err =
        cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      ptr = nullptr;
      (void)cudaGetLastError();
      return Status::error(cudaErrorMessage(
          err, fmt::format("cudaHostAlloc(&ptr, {} bytes)", bytes).c_str(),
          __FILE__, __LINE__));
    }
    return Status::ok();
  }
  void deallocateHost(void *ptr, size_t) override {
    if (ptr)
      (void)cudaFreeHost(ptr);
  }
  // Page-locked `host`: the copy is queued, and the host goes on.
  Status copyFromHostAsync(void *dst, const void *host, size_t bytes) override {
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream()));
    return finishIfHost();
  }
  int64_t liveBytes() const override { return live.load(); }
  int64_t peakBytes() const override { return peak.load(); }
  StatusOr<int64_t> availableBytes() const override {
    size_t free = 0, total = 0;
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    PIPER_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free);
  }

private:
  cudaStream_t stream() const {
    return currentStream ? currentStream : hostStream;
  }
  // Outside a stream's worker, device work is complete on return.
  Status finishIfHost() const {
    if (!currentStream)
      PIPER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(hostStream));
    return Status::ok();
  }

  int ordinal;
  cudaStream_t hostStream;
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
};

class CudaEvent final : public Event {
public:
  static Status create(int ordinal, std::unique_ptr<Event> &out) {
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    cudaEvent_t event = nullptr;
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    out.reset(new CudaEvent(event));
    return Status::ok();
  }
  ~CudaEvent() override { cudaEventDestroy(event); }

  Status signal(uint64_t v) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      // Not published when the record fails: the stream fails, and the
      // executor's abort then wakes the waiters.
      if (currentStream)
        PIPER_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, currentStream));
      onDevice = currentStream != nullptr;
      recordedIn = currentStream ? currentCapture : 0;
      if (current.load() < v)
        current.store(v);
    }
    cv.notify_all();
    return Status::ok();
  }
  Status wait(uint64_t v, const std::atomic<bool> &abort) override {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return current.load() >= v || abort.load(); });
    if (current.load() < v)
      return abortedWait(v);
    // The latest record is at or after the one for v in the signaling
    // stream's order. A signal from a host thread means its work was done.
    // A record made in another capture than the waiter's (or in one, for a
    // waiter not capturing) belongs to a step that ended before this one
    // began: its work is done, and CUDA refuses to wait for a record that
    // is not in the waiter's own capture.
    if (onDevice && recordedIn == currentCapture) {
      if (currentStream)
        PIPER_CUDA_RETURN_IF_ERROR(
            cudaStreamWaitEvent(currentStream, event, 0));
      else
        PIPER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event));
    }
    return Status::ok();
  }
  void wake() override {
    { std::lock_guard<std::mutex> lock(mu); }
    cv.notify_all();
  }
  uint64_t value() const override { return current.load(); }

private:
  explicit CudaEvent(cudaEvent_t event) : event(event) {}

  cudaEvent_t event = nullptr;
  bool onDevice = false;   // whether the latest signal recorded `event`
  uint64_t recordedIn = 0; // the capture that record was made in (0: none)
  std::atomic<uint64_t> current{0};
  std::mutex mu;
  std::condition_variable cv;
};

/// A host worker thread owning a non-blocking CUDA stream, bound by name
/// to the device's communicator (NCCL issues the stream's operations on
/// it).
class CudaStream final : public Stream {
public:
  static Status create(std::string name, int ordinal, Communicator *comm,
                       gpu::AttentionMode attention, CudaLaunchTimers *timers,
                       std::unique_ptr<Stream> &out) {
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    cudaStream_t cuda = nullptr;
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&cuda, cudaStreamNonBlocking));
    out.reset(new CudaStream(std::move(name), ordinal, cuda, comm, attention,
                             timers));
    return Status::ok();
  }
  ~CudaStream() override {
    worker.reset(); // runs the queued work, then stops the thread
    if (comm)
      comm->unbindDeviceStream(streamName, cuda);
    cudaStreamSynchronize(cuda);
    cudaStreamDestroy(cuda);
  }

  const std::string &name() const override { return streamName; }

  void enqueue(std::function<void()> work) override {
    worker->enqueue(std::move(work));
  }

  Status synchronize() override {
    worker->synchronize();
    if (capturing.load())
      return Status::ok(); // nothing captured runs until the launch
    auto started = static_cast<cudaError_t>(startError.load());
    if (started != cudaSuccess)
      return Status::error(cudaErrorMessage(
          started, "cudaSetDevice(ordinal) on the worker", __FILE__, __LINE__));
    // A kernel that faulted after its launch returned shows here: name the
    // stream's last kernel, the likely culprit (gpu-review A.5).
    cudaError_t err = cudaStreamSynchronize(cuda);
    if (err != cudaSuccess)
      return cudaCallError(err, "cudaStreamSynchronize(stream)", __FILE__,
                           __LINE__, lastKernel.load());
    return Status::ok();
  }

  cudaStream_t handle() const { return cuda; }

  /// Makes the worker's device work part of capture `capture` (0: none
  /// again) from the work enqueued after this call, its constant tables'
  /// refills going to `refills`.
  void setCapture(uint64_t capture, std::vector<gpu::ConstantRefill> *refills) {
    capturing.store(capture != 0);
    worker->enqueue([this, capture, refills] {
      currentCapture = capture;
      resources->setCapture(refills);
    });
    worker->synchronize();
  }

private:
  CudaStream(std::string name, int ordinal, cudaStream_t cuda,
             Communicator *comm, gpu::AttentionMode attention,
             CudaLaunchTimers *timers)
      : streamName(std::move(name)), ordinal(ordinal), cuda(cuda), comm(comm) {
    if (comm)
      comm->bindDeviceStream(streamName, cuda);
    // The worker issues this stream's device work: its thread selects the
    // GPU and makes `cuda` the stream kernels and copies run on. Should the
    // selection fail, synchronize() says so.
    resources =
        std::make_unique<CudaKernelResources>(ordinal, attention, timers);
    worker = std::make_unique<HostWorker>([this] {
      startError.store(static_cast<int>(cudaSetDevice(this->ordinal)));
      currentStream = this->cuda;
      currentResources = resources.get();
      streamLastKernel = &this->lastKernel;
    });
  }

  std::string streamName;
  int ordinal;
  cudaStream_t cuda = nullptr;
  Communicator *comm; // not owned; outlives the stream
  std::atomic<int> startError{cudaSuccess};
  std::atomic<const char *> lastKernel{nullptr};
  std::atomic<bool> capturing{false};
  std::unique_ptr<CudaKernelResources> resources;
  std::unique_ptr<HostWorker> worker;
};

class CudaDevice final : public Device {
public:
  CudaDevice(int ordinal, cudaStream_t hostStream, Communicator *comm,
             gpu::AttentionMode attention, bool timeLaunches)
      : ordinal(ordinal), attention(attention),
        timers(timeLaunches ? &launchTimers : nullptr), hostStream(hostStream),
        memory(ordinal, hostStream), hostResources(ordinal, attention, timers),
        comm(comm) {}
  ~CudaDevice() override {
    cudaStreamSynchronize(hostStream);
    cudaStreamDestroy(hostStream);
  }
  std::string name() const override { return "cuda"; }
  Allocator &allocator() override { return memory; }
  Status createStream(const std::string &name,
                      std::unique_ptr<Stream> &stream) override {
    return CudaStream::create(name, ordinal, comm, attention, timers, stream);
  }
  Status createEvent(std::unique_ptr<Event> &event) override {
    return CudaEvent::create(ordinal, event);
  }
  // The GPU kernel registry (runtime/hal/gpu/GpuKernels.h): the same ops
  // as the CPU's; the executor checks them at load.
  const KernelInfo *findKernel(const std::string &name) const override {
    return gpu::findKernelInfo(name);
  }
  std::vector<std::string> kernelNames() const override {
    return gpu::kernelInfoNames();
  }
  bool roundsOutputs(const KernelInfo &info) const override {
    return gpu::kernelRoundsOutputs(info);
  }
  bool readsPackedInput(const KernelInfo &info, int input) const override {
    return gpu::kernelReadsPackedInput(info, input);
  }
  bool writesPackedOutput(const KernelInfo &info, int output) const override {
    return gpu::kernelWritesPackedOutput(info, output);
  }
  // Queued on the calling stream; called off-stream (loading, tests), the
  // work is complete on return.
  Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                   const KernelAttrs &attrs,
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &kctx) override {
    Status status = gpu::runKernel(info, kernel, attrs, inputs, outputs, kctx,
                                   context(kctx.lowPrecision));
    PIPER_RETURN_IF_ERROR(status);
    return finishIfHost();
  }
  Status prepareKernel(const KernelInfo &info, const plan::Kernel &kernel,
                       const KernelAttrs &attrs,
                       const std::vector<TensorRef> &inputs,
                       const std::vector<TensorRef> &outputs,
                       KernelContext &kctx) override {
    PIPER_RETURN_IF_ERROR(gpu::prepareKernel(info, kernel, attrs, inputs,
                                             outputs, kctx,
                                             context(kctx.lowPrecision)));
    return finishIfHost();
  }
  Status runAdamwCalls(const KernelInfo &, const std::vector<AdamwCall> &calls,
                       KernelContext &kctx, size_t &failed) override {
    PIPER_RETURN_IF_ERROR(
        gpu::runAdamwCalls(calls, kctx, context(false), failed));
    return finishIfHost();
  }
  Status createSquareSums(int slots,
                          std::unique_ptr<SquareSums> &sums) override;
  Status createLossSums(int slots, std::unique_ptr<LossSums> &sums) override;
  Status add(float *dst, const float *src, int64_t n) override {
    PIPER_RETURN_IF_ERROR(gpu::launchAdd(context(), dst, src, dst, n));
    return finishIfHost();
  }
  Status packBf16(uint16_t *dst, const float *src, int64_t n) override {
    PIPER_RETURN_IF_ERROR(gpu::launchPackBf16(context(), dst, src, n));
    return finishIfHost();
  }
  Status unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    PIPER_RETURN_IF_ERROR(gpu::launchUnpackBf16(context(), dst, src, n));
    return finishIfHost();
  }
  Status roundBf16(float *x, int64_t n) override {
    PIPER_RETURN_IF_ERROR(gpu::launchRoundBf16(context(), x, n));
    return finishIfHost();
  }
  Status packRowBlocks(const RowBlocks &shape, const void *input,
                       const int32_t *counts, void *blocks, int32_t *sent,
                       int32_t *fault) override {
    PIPER_RETURN_IF_ERROR(gpu::packRowBlocks(context(), shape, input, counts,
                                             blocks, sent, fault));
    return finishIfHost();
  }
  Status unpackRowBlocks(const RowBlocks &shape, const void *blocks,
                         const int32_t *received, void *output,
                         int32_t *fault) override {
    PIPER_RETURN_IF_ERROR(gpu::unpackRowBlocks(context(), shape, blocks,
                                               received, output, fault));
    return finishIfHost();
  }
  Communicator *communicator() override { return comm; }
  std::string stepCaptureRefusal() const override { return ""; }
  Status beginStepCapture(const std::vector<Stream *> &streams) override;
  Status endStepCapture(std::unique_ptr<StepGraph> &graph) override;
  Status collectLaunchTimes() override {
    return timers ? timers->collect() : Status::ok();
  }
  LaunchTimes launchTimes() const override {
    return timers ? timers->times() : LaunchTimes();
  }
  void resetLaunchTimes() override {
    if (timers)
      timers->reset();
  }

  // The calling stream's kernel context, or the device's own (host
  // stream) off-stream.
  gpu::Context context(bool bf16 = false) {
    if (currentResources)
      return currentResources->context(currentStream, bf16);
    return hostResources.context(hostStream, bf16);
  }

private:
  Status finishIfHost() {
    if (!currentStream)
      PIPER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(hostStream));
    return Status::ok();
  }

  int ordinal;
  gpu::AttentionMode attention;
  CudaLaunchTimers launchTimers;
  CudaLaunchTimers *timers; // &launchTimers with --profile=gpu, else null
  cudaStream_t hostStream;
  CudaAllocator memory;
  CudaKernelResources hostResources;
  Communicator *comm;
  std::unique_ptr<CudaStepCapture> capture; // the one under way
};

Status CudaDevice::beginStepCapture(const std::vector<Stream *> &streams) {
  if (capture)
    return Status::error("beginning a step capture: one is under way");
  std::vector<CudaCaptureStream> capturing;
  for (Stream *stream : streams) {
    auto *cuda = static_cast<CudaStream *>(stream); // made by createStream
    capturing.push_back(
        {cuda->handle(),
         [cuda](uint64_t id, std::vector<gpu::ConstantRefill> *refills) {
           cuda->setCapture(id, refills);
         }});
  }
  return CudaStepCapture::begin(ordinal, capturesBegun.fetch_add(1) + 1,
                                std::move(capturing), capture);
}

Status CudaDevice::endStepCapture(std::unique_ptr<StepGraph> &graph) {
  graph = nullptr;
  if (!capture)
    return Status::error("ending a step capture: none is under way");
  return CudaStepCapture::end(std::move(capture), graph);
}

Status CudaDevice::createLossSums(int slots, std::unique_ptr<LossSums> &sums) {
  return createCudaLossSums(
      ordinal, slots, [this] { return context(); }, memory, sums);
}

Status CudaDevice::createSquareSums(int slots,
                                    std::unique_ptr<SquareSums> &sums) {
  return createCudaSquareSums(
      ordinal, slots, [this] { return context(); }, memory, sums);
}

} // namespace

void noteKernelLaunch(const char *kernel) {
  threadLastKernel = kernel;
  if (streamLastKernel)
    streamLastKernel->store(kernel, std::memory_order_relaxed);
}

const char *lastKernelLaunched() { return threadLastKernel; }

bool cudaBackendBuilt() { return true; }

Status cudaDeviceCount(int &count) {
  count = 0;
  PIPER_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  return Status::ok();
}

Status checkCudaBackend() {
  int count = 0;
  Status st = cudaDeviceCount(count);
  if (!st)
    return Status::error("no usable CUDA device: " + st.message());
  if (count == 0)
    return Status::error("no usable CUDA device: cudaGetDeviceCount found 0");
  return Status::ok();
}

std::unique_ptr<Device> createCudaDevice(int ordinal, Communicator *comm,
                                         Status &status,
                                         const DeviceOptions &options) {
  int count = 0;
  status = cudaDeviceCount(count);
  if (!status)
    return nullptr;
  if (ordinal < 0 || ordinal >= count) {
    status = Status::error(fmt::format(
        "CUDA device {} does not exist ({} visible)", ordinal, count));
    return nullptr;
  }
  status = [&]() -> Status {
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    return Status::ok();
  }();
  if (!status)
    return nullptr;
  cudaStream_t hostStream = nullptr;
  status = [&]() -> Status {
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&hostStream, cudaStreamNonBlocking));
    return Status::ok();
  }();
  if (!status)
    return nullptr;
  // GEMMs need cuBLASLt: a missing library is an error now, not at the
  // first linear kernel.
  status = loadCublasLt();
  if (!status)
    return nullptr;
  gpu::AttentionMode attention = gpu::AttentionMode::Auto;
  if (options.attention == AttentionChoice::Cudnn)
    attention = gpu::AttentionMode::Cudnn;
  else if (options.attention == AttentionChoice::Simt)
    attention = gpu::AttentionMode::Simt;
  return std::make_unique<CudaDevice>(ordinal, hostStream, comm, attention,
                                      options.timeLaunches);
}

} // namespace piper::runtime::hal
