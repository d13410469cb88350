// The emulated GPU device (EmulatedDevice.h).
#include "runtime/hal/gpu/host/EmulatedDevice.h"

#include <cstdlib>
#include <cstdio>
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

// The executor's elementwise methods return nothing: a launch error here is
// a bug in the emulation, not in the plan.
void mustSucceed(const Status &status) {
  if (status)
    return;
  std::fprintf(stderr, "piper-run: backend 'cuda-emulation': %s\n",
               status.message().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

class EmulatedGpuDevice final : public Device {
public:
  explicit EmulatedGpuDevice(Communicator *comm)
      : host(createCpuDevice(comm)) {}

  std::string name() const override { return "cuda-emulation"; }
  Allocator &allocator() override { return host->allocator(); }
  std::unique_ptr<Stream> createStream(const std::string &name) override {
    return host->createStream(name);
  }
  std::unique_ptr<Event> createEvent() override { return host->createEvent(); }
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
  double sumOfSquares(const float *x, int64_t n) override {
    double result = 0;
    mustSucceed(gpu::sumOfSquares(hostContext(), x, n, result));
    return result;
  }
  void scale(float *x, float s, int64_t n) override {
    mustSucceed(gpu::launchScale(hostContext(), x, s, n));
  }
  void add(float *dst, const float *src, int64_t n) override {
    mustSucceed(gpu::launchAdd(hostContext(), dst, src, dst, n));
  }
  void packBf16(uint16_t *dst, const float *src, int64_t n) override {
    mustSucceed(gpu::launchPackBf16(hostContext(), dst, src, n));
  }
  void unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    mustSucceed(gpu::launchUnpackBf16(hostContext(), dst, src, n));
  }
  void roundBf16(float *x, int64_t n) override {
    mustSucceed(gpu::launchRoundBf16(hostContext(), x, n));
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
