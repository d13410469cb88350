// The emulated GPU device (EmulatedDevice.h).
#include "runtime/hal/gpu/host/EmulatedDevice.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/hal/LaunchTimes.h"

#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/host/HostFusedAttention.h"

namespace piper::runtime::hal {

namespace {

namespace gpu = PIPER_GPU_NS;

/// Host scratch of the calling thread (one per stream worker).
class HostWorkspace final : public gpu::Workspace {
public:
  Status reserve(size_t bytes, void *&ptr) override {
    size_t words = (bytes + 7) / 8;
    if (block.size() < words)
      block.resize(words);
    ptr = block.data();
    return Status::ok();
  }

private:
  std::vector<double> block;
};

/// Constant tables in host memory: a "host" block and a "device" block
/// apart, so that a launch reads only what was copied to the device.
class HostConstantTables final : public gpu::ConstantTables {
public:
  Status get(const void *site, size_t bytes, void *&host,
             void *&device) override {
    Table &t = tables[{site, bytes}];
    const size_t words = (bytes + 7) / 8;
    if (t.host.size() < words) {
      t.host.assign(words, 0.0);
      t.device.assign(words, 0.0);
    }
    host = t.host.data();
    device = t.device.data();
    return Status::ok();
  }

private:
  struct Table {
    std::vector<double> host, device;
  };
  std::map<std::pair<const void *, size_t>, Table> tables;
};

gpu::Context hostContext(bool bf16 = false) {
  // Per thread: each emulated stream is a host thread.
  thread_local HostWorkspace workspace;
  thread_local HostConstantTables constants;
  gpu::Context ctx;
  ctx.workspace = &workspace;
  ctx.constants = &constants;
  ctx.bf16 = bf16;
  return ctx;
}

/// --profile=gpu on the emulation: each launch timed by the host clock (the
/// emulation runs a launch before the launcher returns), from any stream's
/// thread.
class HostLaunchTimer final : public gpu::LaunchTimer {
public:
  Status begin(const gpu::Context &) override {
    started = nowMs();
    return Status::ok();
  }
  Status end(const gpu::Context &, const char *name) override {
    double to = nowMs();
    std::lock_guard<std::mutex> lock(mu);
    totals.add(name, started, to);
    return Status::ok();
  }
  void endBatch() {
    std::lock_guard<std::mutex> lock(mu);
    totals.endBatch();
  }
  LaunchTimes times() const {
    std::lock_guard<std::mutex> lock(mu);
    return totals.times();
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu);
    totals.reset();
  }

private:
  static double nowMs() {
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static thread_local double started;
  mutable std::mutex mu;
  LaunchTimeTotals totals;
};

thread_local double HostLaunchTimer::started = 0;

std::atomic<int64_t> syncCalls{0};

/// A host stream whose synchronize() counts (emulatedSyncCalls).
class EmulatedStream final : public Stream {
public:
  explicit EmulatedStream(std::unique_ptr<Stream> host)
      : host(std::move(host)) {}
  const std::string &name() const override { return host->name(); }
  void enqueue(std::function<void()> work) override {
    host->enqueue(std::move(work));
  }
  Status synchronize() override {
    countEmulatedSync();
    return host->synchronize();
  }

private:
  std::unique_ptr<Stream> host;
};

/// Set by injectEmulatedDeviceError; the next operation takes it.
std::atomic<bool> errorInjected{false};

/// The injected error of operation `what`, once; else ok.
Status injected(const std::string &what) {
  if (!errorInjected.load(std::memory_order_relaxed) ||
      !errorInjected.exchange(false))
    return Status::ok();
  return Status::error(what + ": emulated device error (PIPER_FAULT "
                              "action=device_error)");
}

/// The CPU backend's memory, where every operation can fail as a CUDA
/// call can (injectEmulatedDeviceError).
class EmulatedAllocator final : public Allocator {
public:
  explicit EmulatedAllocator(Allocator &host) : host(host) {}
  Status allocate(size_t bytes, void *&ptr) override {
    ptr = nullptr;
    PIPER_RETURN_IF_ERROR(
        injected("allocation of " + std::to_string(bytes) + " bytes"));
    return host.allocate(bytes, ptr);
  }
  void deallocate(void *ptr, size_t bytes) override {
    host.deallocate(ptr, bytes);
  }
  Status zero(void *ptr, size_t bytes) override {
    PIPER_RETURN_IF_ERROR(
        injected("zeroing " + std::to_string(bytes) + " bytes"));
    return host.zero(ptr, bytes);
  }
  Status copy(void *dst, const void *src, size_t bytes) override {
    PIPER_RETURN_IF_ERROR(
        injected("copying " + std::to_string(bytes) + " bytes"));
    return host.copy(dst, src, bytes);
  }
  Status copyToHost(void *hostPtr, const void *src, size_t bytes) override {
    countEmulatedSync();
    PIPER_RETURN_IF_ERROR(
        injected("copying " + std::to_string(bytes) + " bytes to the host"));
    return host.copyToHost(hostPtr, src, bytes);
  }
  Status copyFromHost(void *dst, const void *hostPtr, size_t bytes) override {
    countEmulatedSync();
    PIPER_RETURN_IF_ERROR(
        injected("copying " + std::to_string(bytes) + " bytes from the host"));
    return host.copyFromHost(dst, hostPtr, bytes);
  }
  Status copyFromHostAsync(void *dst, const void *hostPtr,
                           size_t bytes) override {
    PIPER_RETURN_IF_ERROR(injected("queueing a copy of " +
                                   std::to_string(bytes) +
                                   " bytes from the host"));
    return host.copyFromHost(dst, hostPtr, bytes);
  }
  int64_t liveBytes() const override { return host.liveBytes(); }
  int64_t peakBytes() const override { return host.peakBytes(); }
  /// The emulated device's memory is the host's.
  StatusOr<int64_t> availableBytes() const override {
    return host.availableBytes();
  }

private:
  Allocator &host;
};

/// The GPU kernel layer's sums of squares into host memory (the emulation's
/// device memory).
class EmulatedSquareSums final : public SquareSums {
public:
  explicit EmulatedSquareSums(int slots)
      : slots(static_cast<size_t>(slots), 0.0) {}
  Status measure(const std::vector<SquaresSpan> &spans) override {
    PIPER_RETURN_IF_ERROR(checkSquaresSlots(spans, 0, size()));
    PIPER_RETURN_IF_ERROR(injected("sum_of_squares"));
    std::vector<gpu::SquaresJob> jobs;
    for (const SquaresSpan &span : spans)
      jobs.push_back({span.data, span.n, &slots[size_t(span.slot)]});
    return gpu::sumsOfSquares(hostContext(), jobs);
  }
  Status read(double *out, int count) override {
    PIPER_RETURN_IF_ERROR(checkSquaresSlots({}, count, size()));
    PIPER_RETURN_IF_ERROR(injected("reading the sums of squares"));
    return gpu::copyToHostSync(hostContext(), out, slots.data(),
                               sizeof(double) * size_t(count));
  }
  Status setWeights(const std::vector<double> &w) override {
    PIPER_RETURN_IF_ERROR(checkSquaresWeights(w.size(), size()));
    weights = w;
    return Status::ok();
  }
  Status weigh() override {
    PIPER_RETURN_IF_ERROR(checkSquaresWeights(weights.size(), size()));
    PIPER_RETURN_IF_ERROR(injected("weigh_squares"));
    return gpu::launchWeighSquares(hostContext(), slots.data(), weights.data(),
                                   size(), &sum);
  }
  double *total() override { return &sum; }
  Status clip(double replicas, double maxNorm) override {
    PIPER_RETURN_IF_ERROR(injected("clip_factor"));
    return gpu::launchClipFactor(hostContext(), &sum, replicas, maxNorm, &norm,
                                 &clipFactor);
  }
  const float *factor() const override { return &clipFactor; }
  Status readNorm(double &out) override {
    PIPER_RETURN_IF_ERROR(injected("reading the gradient norm"));
    return gpu::copyToHostSync(hostContext(), &out, &norm, sizeof(double));
  }

private:
  int size() const { return static_cast<int>(slots.size()); }
  std::vector<double> slots, weights;
  double sum = 0, norm = 0;
  float clipFactor = 1;
};

/// Loss accumulators in host memory (the emulation's device memory), which
/// the GPU kernel layer's `loss_accumulate` adds to; reading them is a
/// synchronizing copy, as on CUDA.
class EmulatedLossSums final : public LossSums {
public:
  explicit EmulatedLossSums(int slots)
      : slots(static_cast<size_t>(slots), 0.0) {}
  double *slot(int i) override { return &slots[static_cast<size_t>(i)]; }
  Status reset() override {
    PIPER_RETURN_IF_ERROR(injected("zeroing the loss accumulators"));
    std::fill(slots.begin(), slots.end(), 0.0);
    return Status::ok();
  }
  Status read(double *out) override {
    PIPER_RETURN_IF_ERROR(injected("reading the loss accumulators"));
    return gpu::copyToHostSync(hostContext(), out, slots.data(),
                               sizeof(double) * slots.size());
  }

private:
  std::vector<double> slots;
};

class EmulatedGpuDevice final : public Device {
public:
  EmulatedGpuDevice(Communicator *comm, const DeviceOptions &options)
      : host(createCpuDevice(comm)), memory(host->allocator()),
        // Auto runs the SIMT kernels here (there is no cuDNN); Cudnn the
        // host model of cuDNN's fused attention.
        attention(options.attention == AttentionChoice::Cudnn
                      ? gpu::AttentionMode::Cudnn
                      : gpu::AttentionMode::Simt),
        timed(options.timeLaunches) {}

  std::string name() const override { return "cuda-emulation"; }
  Allocator &allocator() override { return memory; }
  Status createStream(const std::string &name,
                      std::unique_ptr<Stream> &stream) override {
    std::unique_ptr<Stream> hostStream;
    PIPER_RETURN_IF_ERROR(host->createStream(name, hostStream));
    stream = std::make_unique<EmulatedStream>(std::move(hostStream));
    return Status::ok();
  }
  Status createEvent(std::unique_ptr<Event> &event) override {
    return host->createEvent(event);
  }
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
  Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                   const KernelAttrs &attrs,
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &ctx) override {
    PIPER_RETURN_IF_ERROR(injected(kernel.op()));
    return gpu::runKernel(info, kernel, attrs, inputs, outputs, ctx,
                          kernelContext(ctx.lowPrecision));
  }
  Status prepareKernel(const KernelInfo &info, const plan::Kernel &kernel,
                       const KernelAttrs &attrs,
                       const std::vector<TensorRef> &inputs,
                       const std::vector<TensorRef> &outputs,
                       KernelContext &ctx) override {
    return gpu::prepareKernel(info, kernel, attrs, inputs, outputs, ctx,
                              kernelContext(ctx.lowPrecision));
  }
  Status runAdamwCalls(const KernelInfo &, const std::vector<AdamwCall> &calls,
                       KernelContext &ctx, size_t &failed) override {
    failed = 0;
    PIPER_RETURN_IF_ERROR(injected("adamw"));
    return gpu::runAdamwCalls(calls, ctx, timedContext(), failed);
  }
  Status createSquareSums(int slots,
                          std::unique_ptr<SquareSums> &sums) override {
    sums = std::make_unique<EmulatedSquareSums>(slots);
    return Status::ok();
  }
  Status createLossSums(int slots, std::unique_ptr<LossSums> &sums) override {
    PIPER_RETURN_IF_ERROR(checkLossSlots(slots));
    sums = std::make_unique<EmulatedLossSums>(slots);
    return Status::ok();
  }
  Status add(float *dst, const float *src, int64_t n) override {
    PIPER_RETURN_IF_ERROR(injected("add"));
    return gpu::launchAdd(timedContext(), dst, src, dst, n);
  }
  Status packBf16(uint16_t *dst, const float *src, int64_t n) override {
    PIPER_RETURN_IF_ERROR(injected("pack_bf16"));
    return gpu::launchPackBf16(timedContext(), dst, src, n);
  }
  Status unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    PIPER_RETURN_IF_ERROR(injected("unpack_bf16"));
    return gpu::launchUnpackBf16(timedContext(), dst, src, n);
  }
  Status roundBf16(float *x, int64_t n) override {
    PIPER_RETURN_IF_ERROR(injected("round_bf16"));
    return gpu::launchRoundBf16(timedContext(), x, n);
  }
  Communicator *communicator() override { return host->communicator(); }
  /// The context of a plan kernel's call.
  gpu::Context kernelContext(bool bf16) {
    gpu::Context gctx = hostContext(bf16);
    gctx.attention = attention;
    gctx.fused = &fused;
    if (timed)
      gctx.timer = &timer;
    return gctx;
  }
  /// The context of the executor's own elementwise work, timed as kernels.
  gpu::Context timedContext() {
    gpu::Context ctx = hostContext();
    if (timed)
      ctx.timer = &timer;
    return ctx;
  }
  Status collectLaunchTimes() override {
    if (timed)
      timer.endBatch();
    return Status::ok();
  }
  LaunchTimes launchTimes() const override {
    return timed ? timer.times() : LaunchTimes();
  }
  void resetLaunchTimes() override { timer.reset(); }

private:
  std::unique_ptr<Device> host;
  EmulatedAllocator memory;
  gpu::AttentionMode attention;
  gpu::HostFusedAttentionProvider fused;
  bool timed;
  HostLaunchTimer timer;
};

} // namespace

std::unique_ptr<Device> createEmulatedGpuDevice(Communicator *comm,
                                                const DeviceOptions &options) {
  return std::make_unique<EmulatedGpuDevice>(comm, options);
}

void injectEmulatedDeviceError() { errorInjected.store(true); }

int64_t emulatedSyncCalls() { return syncCalls.load(); }

void countEmulatedSync() { syncCalls.fetch_add(1); }

} // namespace piper::runtime::hal
