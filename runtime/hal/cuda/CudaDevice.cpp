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
// the call returns, as on the CPU.
//
// Events. signal(v) on a stream records a CUDA event on that stream, then
// publishes v to host waiters; wait(v) on a stream blocks the host thread
// only until the record for v has been issued, then makes the CUDA stream
// wait for it (cudaStreamWaitEvent): the GPU does the waiting. One CUDA
// event per Event: a waiter that comes after a later signal waits for that
// later record, never for less. The executor signals value t once in step
// t and synchronizes every stream at the end of a step, so that later
// record never depends on the waiter.
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "fmt/core.h"
#include "runtime/hal/cuda/CudaBackend.h"
#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/cuda/CudaKernelContext.h"
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/HostWorker.h"

namespace piper::runtime::hal {

std::string cudaErrorMessage(cudaError_t error, const char *call,
                             const char *file, int line) {
  return fmt::format("{}: {}: {} ({}:{})", call, cudaGetErrorName(error),
                     cudaGetErrorString(error), file, line);
}

void cudaFatal(cudaError_t error, const char *call, const char *file,
               int line) {
  std::fprintf(stderr, "piper-run: CUDA error: %s\n",
               cudaErrorMessage(error, call, file, line).c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

namespace {

/// The CUDA stream of the Stream whose worker runs on this thread; null on
/// other threads.
thread_local cudaStream_t currentStream = nullptr;
/// The GPU kernels' resources of that Stream.
thread_local CudaKernelResources *currentResources = nullptr;

/// The device memory: plain cudaMalloc per allocation (the executor makes
/// exactly one, the plan's arena), never managed memory.
class CudaAllocator final : public Allocator {
public:
  CudaAllocator(int ordinal, cudaStream_t hostStream)
      : ordinal(ordinal), hostStream(hostStream) {}

  void *allocate(size_t bytes) override {
    void *ptr = nullptr;
    PIPER_CUDA_CHECK(cudaSetDevice(ordinal));
    cudaError_t err = cudaMalloc(&ptr, bytes == 0 ? 1 : bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError(); // clear it: the caller reports null
      return nullptr;
    }
    if (err != cudaSuccess)
      cudaFatal(err, "cudaMalloc(&ptr, bytes)", __FILE__, __LINE__);
    int64_t now = live.fetch_add(static_cast<int64_t>(bytes)) +
                  static_cast<int64_t>(bytes);
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    return ptr; // 256-byte aligned
  }
  void deallocate(void *ptr, size_t bytes) override {
    if (!ptr)
      return;
    PIPER_CUDA_CHECK(cudaFree(ptr));
    live.fetch_sub(static_cast<int64_t>(bytes));
  }
  void zero(void *ptr, size_t bytes) override {
    PIPER_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream()));
    finishIfHost();
  }
  void copy(void *dst, const void *src, size_t bytes) override {
    PIPER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes,
                                     cudaMemcpyDeviceToDevice, stream()));
    finishIfHost();
  }
  // Host memory is readable (or reusable) when these return: both wait for
  // their copy, on the calling stream.
  void copyToHost(void *host, const void *src, size_t bytes) override {
    // cudaMemcpyDefault: callers (the staging communicator) may pass host
    // memory as `src` too.
    PIPER_CUDA_CHECK(
        cudaMemcpyAsync(host, src, bytes, cudaMemcpyDefault, stream()));
    PIPER_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void copyFromHost(void *dst, const void *host, size_t bytes) override {
    PIPER_CUDA_CHECK(
        cudaMemcpyAsync(dst, host, bytes, cudaMemcpyDefault, stream()));
    PIPER_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  int64_t liveBytes() const override { return live.load(); }
  int64_t peakBytes() const override { return peak.load(); }

private:
  cudaStream_t stream() const {
    return currentStream ? currentStream : hostStream;
  }
  // Outside a stream's worker, device work is complete on return.
  void finishIfHost() const {
    if (!currentStream)
      PIPER_CUDA_CHECK(cudaStreamSynchronize(hostStream));
  }

  int ordinal;
  cudaStream_t hostStream;
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
};

class CudaEvent final : public Event {
public:
  explicit CudaEvent(int ordinal) {
    PIPER_CUDA_CHECK(cudaSetDevice(ordinal));
    PIPER_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  ~CudaEvent() override { cudaEventDestroy(event); }

  void signal(uint64_t v) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (currentStream)
        PIPER_CUDA_CHECK(cudaEventRecord(event, currentStream));
      onDevice = currentStream != nullptr;
      if (current.load() < v)
        current.store(v);
    }
    cv.notify_all();
  }
  bool wait(uint64_t v, const std::atomic<bool> &abort) override {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return current.load() >= v || abort.load(); });
    if (current.load() < v)
      return false;
    // The latest record is at or after the one for v in the signaling
    // stream's order. A signal from a host thread means its work was done.
    if (onDevice) {
      if (currentStream)
        PIPER_CUDA_CHECK(cudaStreamWaitEvent(currentStream, event, 0));
      else
        PIPER_CUDA_CHECK(cudaEventSynchronize(event));
    }
    return true;
  }
  void wake() override {
    { std::lock_guard<std::mutex> lock(mu); }
    cv.notify_all();
  }
  uint64_t value() const override { return current.load(); }

private:
  cudaEvent_t event = nullptr;
  bool onDevice = false; // whether the latest signal recorded `event`
  std::atomic<uint64_t> current{0};
  std::mutex mu;
  std::condition_variable cv;
};

/// A host worker thread owning a non-blocking CUDA stream.
class CudaStream final : public Stream {
public:
  CudaStream(std::string name, int ordinal)
      : streamName(std::move(name)), ordinal(ordinal) {
    PIPER_CUDA_CHECK(cudaSetDevice(ordinal));
    PIPER_CUDA_CHECK(cudaStreamCreateWithFlags(&cuda, cudaStreamNonBlocking));
    // The worker issues this stream's device work: its thread selects the
    // GPU and makes `cuda` the stream kernels and copies run on.
    resources = std::make_unique<CudaKernelResources>(ordinal);
    worker = std::make_unique<HostWorker>([this] {
      PIPER_CUDA_CHECK(cudaSetDevice(this->ordinal));
      currentStream = cuda;
      currentResources = resources.get();
    });
  }
  ~CudaStream() override {
    worker.reset(); // runs the queued work, then stops the thread
    cudaStreamSynchronize(cuda);
    cudaStreamDestroy(cuda);
  }

  const std::string &name() const override { return streamName; }

  void enqueue(std::function<void()> work) override {
    worker->enqueue(std::move(work));
  }

  void synchronize() override {
    worker->synchronize();
    PIPER_CUDA_CHECK(cudaStreamSynchronize(cuda));
  }

private:
  std::string streamName;
  int ordinal;
  cudaStream_t cuda = nullptr;
  std::unique_ptr<CudaKernelResources> resources;
  std::unique_ptr<HostWorker> worker;
};

// A void HAL method's kernel failed: the device is in an unknown state.
void mustSucceed(const Status &status) {
  if (status)
    return;
  std::fprintf(stderr, "piper-run: CUDA error: %s\n",
               status.message().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

class CudaDevice final : public Device {
public:
  CudaDevice(int ordinal, cudaStream_t hostStream, Communicator *comm)
      : ordinal(ordinal), hostStream(hostStream),
        memory(ordinal, hostStream), comm(comm) {}
  ~CudaDevice() override {
    cudaStreamSynchronize(hostStream);
    cudaStreamDestroy(hostStream);
  }
  std::string name() const override { return "cuda"; }
  Allocator &allocator() override { return memory; }
  std::unique_ptr<Stream> createStream(const std::string &name) override {
    return std::make_unique<CudaStream>(name, ordinal);
  }
  std::unique_ptr<Event> createEvent() override {
    return std::make_unique<CudaEvent>(ordinal);
  }
  // The GPU kernel registry (runtime/hal/gpu/GpuKernels.h): the same ops
  // as the CPU's; the executor checks them at load.
  const KernelInfo *findKernel(const std::string &name) const override {
    return gpu::findKernelInfo(name);
  }
  std::vector<std::string> kernelNames() const override {
    return gpu::kernelInfoNames();
  }
  // Queued on the calling stream; called off-stream (loading, tests), the
  // work is complete on return.
  Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &kctx) override {
    Status status = gpu::runKernel(info, kernel, inputs, outputs, kctx,
                                   context(kctx.lowPrecision));
    PIPER_RETURN_IF_ERROR(status);
    return finishIfHost();
  }
  double sumOfSquares(const float *x, int64_t n) override {
    double result = 0;
    mustSucceed(gpu::sumOfSquares(context(), x, n, result));
    return result;
  }
  void scale(float *x, float s, int64_t n) override {
    mustSucceed(gpu::launchScale(context(), x, s, n));
    mustSucceed(finishIfHost());
  }
  void add(float *dst, const float *src, int64_t n) override {
    mustSucceed(gpu::launchAdd(context(), dst, src, dst, n));
    mustSucceed(finishIfHost());
  }
  void packBf16(uint16_t *dst, const float *src, int64_t n) override {
    mustSucceed(gpu::launchPackBf16(context(), dst, src, n));
    mustSucceed(finishIfHost());
  }
  void unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    mustSucceed(gpu::launchUnpackBf16(context(), dst, src, n));
    mustSucceed(finishIfHost());
  }
  void roundBf16(float *x, int64_t n) override {
    mustSucceed(gpu::launchRoundBf16(context(), x, n));
    mustSucceed(finishIfHost());
  }
  Communicator *communicator() override { return comm; }

private:
  // The calling stream's kernel context, or the device's own (host
  // stream) off-stream.
  gpu::Context context(bool bf16 = false) {
    if (currentResources)
      return currentResources->context(currentStream, bf16);
    return hostResources.context(hostStream, bf16);
  }
  Status finishIfHost() {
    if (!currentStream)
      PIPER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(hostStream));
    return Status::ok();
  }

  int ordinal;
  cudaStream_t hostStream;
  CudaAllocator memory;
  CudaKernelResources hostResources{ordinal};
  Communicator *comm;
};

} // namespace

cudaStream_t currentCudaStream() { return currentStream; }

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
                                         Status &status) {
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
  return std::make_unique<CudaDevice>(ordinal, hostStream, comm);
}

} // namespace piper::runtime::hal
