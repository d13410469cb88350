// The emulated GPU device (EmulatedDevice.h).
#include "runtime/hal/gpu/host/EmulatedDevice.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/hal/LaunchTimes.h"

#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/host/EmulatedCommunicator.h"
#include "runtime/hal/gpu/host/HostCapture.h"
#include "runtime/hal/gpu/host/HostFusedAttention.h"

namespace piper::runtime::hal {

namespace {

namespace gpu = PIPER_GPU_NS;

/// Host scratch of the calling thread (one per stream worker). A block it
/// outgrows is kept, not freed: work captured from a step may still
/// address it when replayed (as the CUDA workspace keeps its blocks once
/// its stream has captured).
class HostWorkspace final : public gpu::Workspace {
public:
  Status reserve(size_t bytes, void *&ptr) override {
    size_t words = (bytes + 7) / 8;
    if (block.size() < words) {
      if (!block.empty())
        retired.push_back(std::move(block));
      block.assign(words, 0.0);
    }
    ptr = block.data();
    return Status::ok();
  }

private:
  std::vector<double> block;
  std::vector<std::vector<double>> retired;
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
  void keepForReplay(gpu::ConstantRefill refill) override {
    if (gpu::HostRecording *r = gpu::currentRecording)
      r->refills.push_back(std::move(refill));
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

/// Set by injectEmulatedDeviceError; the next operation (whose name starts
/// with injectedOnly, when not empty) takes it.
std::atomic<bool> errorInjected{false};
std::mutex injectedMu;
std::string injectedOnly;

/// The injected error of operation `what`, once; else ok. An operation
/// `namedOnly` takes it only when injectEmulatedDeviceError named it.
Status injected(const std::string &what, bool namedOnly = false) {
  if (!errorInjected.load(std::memory_order_relaxed))
    return Status::ok();
  {
    std::lock_guard<std::mutex> lock(injectedMu);
    if ((namedOnly && injectedOnly.empty()) ||
        what.compare(0, injectedOnly.size(), injectedOnly) != 0)
      return Status::ok();
  }
  if (!errorInjected.exchange(false))
    return Status::ok();
  return Status::error(what + ": emulated device error (PIPER_FAULT "
                              "action=device_error)");
}

/// A host stream whose synchronize() counts (emulatedSyncCalls), except
/// while it captures a step: then it waits for the host work only, as a
/// capturing CUDA stream's does. An error of its replayed work (fail())
/// is returned by every later synchronize, as a CUDA stream's fault is.
class EmulatedStream final : public Stream {
public:
  explicit EmulatedStream(std::unique_ptr<Stream> host)
      : host(std::move(host)) {}
  const std::string &name() const override { return host->name(); }
  void enqueue(std::function<void()> work) override {
    host->enqueue(std::move(work));
  }
  Status synchronize() override {
    if (!capturing.load())
      countEmulatedSync();
    PIPER_RETURN_IF_ERROR(host->synchronize());
    {
      std::lock_guard<std::mutex> lock(faultMu);
      PIPER_RETURN_IF_ERROR(fault);
    }
    // A fault of the work found when the stream is synchronized (only
    // when asked for by name: injectEmulatedDeviceError).
    return capturing.load() ? Status::ok()
                            : injected("synchronizing the stream", true);
  }
  /// Makes the stream's worker record (`recording`) or, with null, run its
  /// device work from the work enqueued after this call.
  Status record(gpu::HostRecording *recording) {
    capturing.store(recording != nullptr);
    host->enqueue([recording] { gpu::currentRecording = recording; });
    return host->synchronize();
  }
  /// Keeps the first error of the stream's replayed work.
  void fail(const Status &status) {
    std::lock_guard<std::mutex> lock(faultMu);
    if (fault.isOk())
      fault = status;
  }

private:
  std::unique_ptr<Stream> host;
  std::atomic<bool> capturing{false};
  std::mutex faultMu;
  Status fault;
};

/// An event of the CPU backend whose signals and waits made while a stream
/// captures a step are also recorded, as the captured work's edges between
/// streams: replayed, a wait waits for its signal of the same launch. A
/// wait whose latest signal came before the capture records nothing: that
/// signal's work had finished by the capture (the end of the step before),
/// and a CUDA graph has no edge to work outside it either.
class EmulatedEvent final : public Event {
public:
  explicit EmulatedEvent(std::unique_ptr<Event> host) : host(std::move(host)) {}
  Status signal(uint64_t value) override {
    gpu::HostRecording *r = gpu::currentRecording;
    // Set before the host signal, which orders it before the waiters'
    // reading it.
    signalledIn.store(r ? r->capture : 0);
    if (r)
      r->work.emplace_back([this, launches = r->launches] {
        {
          std::lock_guard<std::mutex> lock(mu);
          replayed = launches->load();
        }
        cv.notify_all();
      });
    return host->signal(value);
  }
  Status wait(uint64_t value, const std::atomic<bool> &abort) override {
    PIPER_RETURN_IF_ERROR(host->wait(value, abort));
    gpu::HostRecording *r = gpu::currentRecording;
    if (r && signalledIn.load() == r->capture)
      r->work.emplace_back([this, launches = r->launches] {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return replayed >= launches->load(); });
      });
    return Status::ok();
  }
  void wake() override { host->wake(); }
  uint64_t value() const override { return host->value(); }

private:
  std::unique_ptr<Event> host;
  std::atomic<uint64_t> signalledIn{0}; // the capture of the latest signal
  std::mutex mu;
  std::condition_variable cv;
  uint64_t replayed = 0; // the launch number of the latest replayed signal
};

/// A step captured on the emulated device: each stream's recorded work,
/// run again on that stream by launch().
class EmulatedStepGraph final : public StepGraph {
public:
  struct Lane {
    EmulatedStream *stream;
    std::unique_ptr<gpu::HostRecording> recording;
  };
  Status launch(const StepValues &values) override;

  std::vector<Lane> lanes;
  /// The number of this capture's latest launch (launchesMade).
  std::atomic<uint64_t> launches{0};
};

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
  // Queued work (recorded while the calling stream captures a step).
  Status zero(void *ptr, size_t bytes) override {
    PIPER_RETURN_IF_ERROR(
        injected("zeroing " + std::to_string(bytes) + " bytes"));
    return queue([=] { return host.zero(ptr, bytes); });
  }
  Status copy(void *dst, const void *src, size_t bytes) override {
    PIPER_RETURN_IF_ERROR(
        injected("copying " + std::to_string(bytes) + " bytes"));
    return queue([=] { return host.copy(dst, src, bytes); });
  }
  Status copyToHost(void *hostPtr, const void *src, size_t bytes) override {
    PIPER_RETURN_IF_ERROR(notCapturing(bytes, "to"));
    countEmulatedSync();
    PIPER_RETURN_IF_ERROR(
        injected("copying " + std::to_string(bytes) + " bytes to the host"));
    return host.copyToHost(hostPtr, src, bytes);
  }
  Status copyFromHost(void *dst, const void *hostPtr, size_t bytes) override {
    PIPER_RETURN_IF_ERROR(notCapturing(bytes, "from"));
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
    return queue([=] { return host.copyFromHost(dst, hostPtr, bytes); });
  }
  int64_t liveBytes() const override { return host.liveBytes(); }
  int64_t peakBytes() const override { return host.peakBytes(); }
  /// The emulated device's memory is the host's.
  StatusOr<int64_t> availableBytes() const override {
    return host.availableBytes();
  }

private:
  /// Runs `op` now, or records it (its error, which the CPU allocator's
  /// copies and memsets never return, cannot reach anyone then).
  template <class Op> Status queue(Op op) {
    if (!gpu::currentRecording)
      return op();
    gpu::runOrRecord([op] { (void)op(); });
    return Status::ok();
  }
  static Status notCapturing(size_t bytes, const char *direction) {
    if (!gpu::currentRecording)
      return Status::ok();
    return Status::error("a synchronizing copy of " + std::to_string(bytes) +
                         " bytes " + direction +
                         " the host while the stream captures a step (the "
                         "host cannot wait for captured work)");
  }

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
  EmulatedGpuDevice(Communicator *comm, Communicator *direct,
                    const DeviceOptions &options)
      : host(createCpuDevice(comm)), memory(host->allocator()),
        streamOrdered(comm ? std::make_unique<EmulatedCommunicator>(
                                 *comm, direct ? *direct : *comm)
                           : nullptr),
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
    std::unique_ptr<Event> hostEvent;
    PIPER_RETURN_IF_ERROR(host->createEvent(hostEvent));
    event = std::make_unique<EmulatedEvent>(std::move(hostEvent));
    return Status::ok();
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
  Status packRowBlocks(const RowBlocks &shape, const void *input,
                       const int32_t *counts, void *blocks, int32_t *sent,
                       int32_t *fault) override {
    PIPER_RETURN_IF_ERROR(injected("pack_row_blocks"));
    return gpu::packRowBlocks(timedContext(), shape, input, counts, blocks,
                              sent, fault);
  }
  Status unpackRowBlocks(const RowBlocks &shape, const void *blocks,
                         const int32_t *received, void *output,
                         int32_t *fault) override {
    PIPER_RETURN_IF_ERROR(injected("unpack_row_blocks"));
    return gpu::unpackRowBlocks(timedContext(), shape, blocks, received, output,
                                fault);
  }
  Status roundBf16(float *x, int64_t n) override {
    PIPER_RETURN_IF_ERROR(injected("round_bf16"));
    return gpu::launchRoundBf16(timedContext(), x, n);
  }
  Communicator *communicator() override { return streamOrdered.get(); }
  std::string stepCaptureRefusal() const override { return ""; }
  Status beginStepCapture(const std::vector<Stream *> &streams) override {
    if (capture)
      return Status::error("beginning a step capture: one is under way");
    PIPER_RETURN_IF_ERROR(injected("beginning a step capture"));
    capture = std::make_unique<EmulatedStepGraph>();
    static std::atomic<uint64_t> capturesBegun{0};
    const uint64_t id = capturesBegun.fetch_add(1) + 1;
    for (Stream *stream : streams) {
      // Created by createStream above.
      auto *emulated = static_cast<EmulatedStream *>(stream);
      auto recording = std::make_unique<gpu::HostRecording>();
      recording->capture = id;
      recording->launches = &capture->launches;
      recording->fail = [emulated](const Status &status) {
        emulated->fail(status);
      };
      PIPER_RETURN_IF_ERROR(emulated->record(recording.get()));
      capture->lanes.push_back({emulated, std::move(recording)});
    }
    return Status::ok();
  }
  Status endStepCapture(std::unique_ptr<StepGraph> &graph) override {
    graph = nullptr;
    if (!capture)
      return Status::error("ending a step capture: none is under way");
    std::unique_ptr<EmulatedStepGraph> captured = std::move(capture);
    for (EmulatedStepGraph::Lane &lane : captured->lanes)
      PIPER_RETURN_IF_ERROR(lane.stream->record(nullptr));
    PIPER_RETURN_IF_ERROR(injected("instantiating a captured step"));
    graph = std::move(captured);
    return Status::ok();
  }
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
  /// The executor's communicator: `comm`'s operations, recorded with the
  /// step while a stream captures.
  std::unique_ptr<EmulatedCommunicator> streamOrdered;
  gpu::AttentionMode attention;
  gpu::HostFusedAttentionProvider fused;
  bool timed;
  HostLaunchTimer timer;
  std::unique_ptr<EmulatedStepGraph> capture; // the one under way
};

/// Numbers every launch of every capture, so that a replayed wait never
/// takes an older launch's signal of its event for its own.
std::atomic<uint64_t> launchesMade{0};

Status EmulatedStepGraph::launch(const StepValues &values) {
  PIPER_RETURN_IF_ERROR(injected("launching a captured step"));
  launches.store(launchesMade.fetch_add(1) + 1);
  // The streams are idle: no captured copy is reading the tables.
  for (Lane &lane : lanes)
    for (const gpu::ConstantRefill &refill : lane.recording->refills)
      refill(values.step, values.lrScale);
  for (Lane &lane : lanes)
    lane.stream->enqueue([recording = lane.recording.get()] {
      for (const std::function<void()> &work : recording->work)
        work();
    });
  return Status::ok();
}

} // namespace

std::unique_ptr<Device> createEmulatedGpuDevice(Communicator *comm,
                                                const DeviceOptions &options,
                                                Communicator *direct) {
  return std::make_unique<EmulatedGpuDevice>(comm, direct, options);
}

void injectEmulatedDeviceError(const std::string &only) {
  {
    std::lock_guard<std::mutex> lock(injectedMu);
    injectedOnly = only;
  }
  errorInjected.store(true);
}

int64_t emulatedSyncCalls() { return syncCalls.load(); }

void countEmulatedSync() { syncCalls.fetch_add(1); }

} // namespace piper::runtime::hal
