// The emulated GPU device (EmulatedDevice.h).
#include "runtime/hal/gpu/host/EmulatedDevice.h"

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

class EmulatedGpuDevice final : public Device {
public:
  explicit EmulatedGpuDevice(Communicator *comm)
      : host(createCpuDevice(comm)) {}

  std::string name() const override { return "cuda-emulation"; }
  Allocator &allocator() override { return host->allocator(); }
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
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &ctx) override {
    return gpu::runKernel(info, kernel, inputs, outputs, ctx,
                          hostContext(ctx.lowPrecision));
  }
  Status sumOfSquares(const float *x, int64_t n, double &result) override {
    return gpu::sumOfSquares(hostContext(), x, n, result);
  }
  Status scale(float *x, float s, int64_t n) override {
    return gpu::launchScale(hostContext(), x, s, n);
  }
  Status add(float *dst, const float *src, int64_t n) override {
    return gpu::launchAdd(hostContext(), dst, src, dst, n);
  }
  Status packBf16(uint16_t *dst, const float *src, int64_t n) override {
    return gpu::launchPackBf16(hostContext(), dst, src, n);
  }
  Status unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    return gpu::launchUnpackBf16(hostContext(), dst, src, n);
  }
  Status roundBf16(float *x, int64_t n) override {
    return gpu::launchRoundBf16(hostContext(), x, n);
  }
  Communicator *communicator() override { return host->communicator(); }

private:
  std::unique_ptr<Device> host;
};

} // namespace

std::unique_ptr<Device> createEmulatedGpuDevice(Communicator *comm) {
  return std::make_unique<EmulatedGpuDevice>(comm);
}

} // namespace piper::runtime::hal
