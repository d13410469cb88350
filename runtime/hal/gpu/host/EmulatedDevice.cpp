// The emulated GPU device (EmulatedDevice.h).
#include "runtime/hal/gpu/host/EmulatedDevice.h"

#include <atomic>
#include <string>
#include <vector>

#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/gpu/ElementwiseLaunch.h"
#include "runtime/hal/gpu/GpuKernels.h"

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

gpu::Context hostContext(bool bf16 = false) {
  thread_local HostWorkspace workspace;
  gpu::Context ctx;
  ctx.workspace = &workspace;
  ctx.bf16 = bf16;
  return ctx;
}

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
    PIPER_RETURN_IF_ERROR(injected("copying " + std::to_string(bytes) +
                                   " bytes to the host"));
    return host.copyToHost(hostPtr, src, bytes);
  }
  Status copyFromHost(void *dst, const void *hostPtr, size_t bytes) override {
    PIPER_RETURN_IF_ERROR(injected("copying " + std::to_string(bytes) +
                                   " bytes from the host"));
    return host.copyFromHost(dst, hostPtr, bytes);
  }
  int64_t liveBytes() const override { return host.liveBytes(); }
  int64_t peakBytes() const override { return host.peakBytes(); }

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

private:
  int size() const { return static_cast<int>(slots.size()); }
  std::vector<double> slots;
};

class EmulatedGpuDevice final : public Device {
public:
  explicit EmulatedGpuDevice(Communicator *comm)
      : host(createCpuDevice(comm)), memory(host->allocator()) {}

  std::string name() const override { return "cuda-emulation"; }
  Allocator &allocator() override { return memory; }
  Status createStream(const std::string &name,
                      std::unique_ptr<Stream> &stream) override {
    return host->createStream(name, stream);
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
  Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                   const KernelAttrs &attrs,
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &ctx) override {
    PIPER_RETURN_IF_ERROR(injected(kernel.op()));
    return gpu::runKernel(info, kernel, attrs, inputs, outputs, ctx,
                          hostContext(ctx.lowPrecision));
  }
  Status createSquareSums(int slots,
                          std::unique_ptr<SquareSums> &sums) override {
    sums = std::make_unique<EmulatedSquareSums>(slots);
    return Status::ok();
  }
  Status scale(float *x, float s, int64_t n) override {
    PIPER_RETURN_IF_ERROR(injected("scale"));
    return gpu::launchScale(hostContext(), x, s, n);
  }
  Status add(float *dst, const float *src, int64_t n) override {
    PIPER_RETURN_IF_ERROR(injected("add"));
    return gpu::launchAdd(hostContext(), dst, src, dst, n);
  }
  Status packBf16(uint16_t *dst, const float *src, int64_t n) override {
    PIPER_RETURN_IF_ERROR(injected("pack_bf16"));
    return gpu::launchPackBf16(hostContext(), dst, src, n);
  }
  Status unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    PIPER_RETURN_IF_ERROR(injected("unpack_bf16"));
    return gpu::launchUnpackBf16(hostContext(), dst, src, n);
  }
  Status roundBf16(float *x, int64_t n) override {
    PIPER_RETURN_IF_ERROR(injected("round_bf16"));
    return gpu::launchRoundBf16(hostContext(), x, n);
  }
  Communicator *communicator() override { return host->communicator(); }

private:
  std::unique_ptr<Device> host;
  EmulatedAllocator memory;
};

} // namespace

std::unique_ptr<Device> createEmulatedGpuDevice(Communicator *comm) {
  return std::make_unique<EmulatedGpuDevice>(comm);
}

void injectEmulatedDeviceError() { errorInjected.store(true); }

} // namespace piper::runtime::hal
