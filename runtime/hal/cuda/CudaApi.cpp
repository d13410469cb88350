// The GPU kernel layer's primitives on CUDA (GpuApi.h): launch errors,
// asynchronous memsets and copies, and the per-stream resources (scratch,
// constant tables, cuBLASLt state, cuDNN attention, launch timer). The
// GEMMs are CudaGemm.cpp's.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "fmt/core.h"
#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/cuda/CudaGemm.h"
#include "runtime/hal/cuda/CudaKernelContext.h"
#include "runtime/hal/cuda/CudaLaunchTimer.h"
#include "runtime/hal/cuda/CudnnAttention.h"
#include "runtime/hal/gpu/GpuApi.h"

namespace piper::runtime::hal {

/// A stream's constant tables: page-locked host blocks (cudaHostAlloc) and
/// device blocks (cudaMalloc), kept for the stream's life.
class CudaConstantTables final : public gpu::ConstantTables {
public:
  explicit CudaConstantTables(int ordinal) : ordinal(ordinal) {}
  ~CudaConstantTables() override {
    for (auto &[key, t] : tables) {
      cudaFreeHost(t.host);
      cudaFree(t.device);
    }
  }
  Status get(const void *site, size_t bytes, void *&host,
             void *&device) override {
    auto [it, added] = tables.try_emplace({site, bytes});
    Table &t = it->second;
    if (added) {
      PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
      cudaError_t e =
          cudaHostAlloc(&t.host, bytes ? bytes : 1, cudaHostAllocPortable);
      if (e == cudaSuccess)
        e = cudaMalloc(&t.device, bytes ? bytes : 1);
      if (e != cudaSuccess) {
        (void)cudaGetLastError(); // out of memory is not sticky: clear it
        if (t.host)
          cudaFreeHost(t.host);
        tables.erase(it);
        return Status::error(cudaErrorMessage(e, "allocating a constant table",
                                              __FILE__, __LINE__));
      }
    }
    host = t.host;
    device = t.device;
    return Status::ok();
  }
  void keepForReplay(gpu::ConstantRefill refill) override {
    if (refills)
      refills->push_back(std::move(refill));
  }
  /// Where keepForReplay keeps refills while the stream captures; null
  /// otherwise.
  std::vector<gpu::ConstantRefill> *refills = nullptr;

private:
  struct Table {
    void *host = nullptr, *device = nullptr;
  };
  int ordinal;
  std::map<std::pair<const void *, size_t>, Table> tables;
};

struct CudaKernelResources::State {
  int ordinal;
  cudaStream_t stream = nullptr;
  CudaWorkspace workspace, operands;
  CudaBlasPtr blas;
  CudnnAttentionState dnn;
  CudaConstantTables constants;
  CudaLaunchTimers *timers = nullptr;
  std::unique_ptr<CudaLaunchTimer> timer;
  State(int ordinal, gpu::AttentionMode attention)
      : ordinal(ordinal), workspace(ordinal, stream), operands(ordinal, stream),
        dnn(attention), constants(ordinal) {}
};

CudaKernelResources::CudaKernelResources(int ordinal,
                                         gpu::AttentionMode attention,
                                         CudaLaunchTimers *timers)
    : state(std::make_unique<State>(ordinal, attention)) {
  state->blas = createCudaBlas(&state->operands);
  if (timers) {
    state->timers = timers;
    state->timer = std::make_unique<CudaLaunchTimer>(ordinal);
    timers->add(state->timer.get());
  }
}

CudaKernelResources::~CudaKernelResources() {
  if (state->timers)
    state->timers->remove(state->timer.get());
}

void CudaKernelResources::setCapture(
    std::vector<gpu::ConstantRefill> *refills) {
  state->constants.refills = refills;
  if (refills) {
    state->workspace.keepBlocks();
    state->operands.keepBlocks();
  }
}

gpu::Context CudaKernelResources::context(cudaStream_t stream, bool bf16) {
  state->stream = stream;
  gpu::Context ctx;
  ctx.stream = stream;
  ctx.workspace = &state->workspace;
  ctx.blas = state->blas.get();
  ctx.bf16 = bf16;
  ctx.attention = state->dnn.mode();
  ctx.fused = &state->dnn;
  ctx.constants = &state->constants;
  ctx.accumulatesInGemm = true;
  ctx.timer = state->timer.get();
  return ctx;
}

namespace gpu {

Status launchStatus(int error, const char *kernel) {
  noteKernelLaunch(kernel);
  if (error == 0)
    return Status::ok();
  auto e = static_cast<cudaError_t>(error);
  return Status::error(fmt::format("{}: kernel launch failed: {}: {}", kernel,
                                   cudaGetErrorName(e), cudaGetErrorString(e)));
}

Status zeroAsync(const Context &ctx, void *ptr, size_t bytes) {
  if (bytes)
    PIPER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr, 0, bytes, ctx.stream));
  return Status::ok();
}

Status copyAsync(const Context &ctx, void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src)
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx.stream));
  return Status::ok();
}

Status copyToDeviceAsync(const Context &ctx, void *dst, const void *src,
                         size_t bytes) {
  if (bytes)
    PIPER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx.stream));
  return Status::ok();
}

Status copyToHostSync(const Context &ctx, void *host, const void *src,
                      size_t bytes) {
  if (!bytes)
    return Status::ok();
  PIPER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ctx.stream));
  PIPER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  return Status::ok();
}

} // namespace gpu

} // namespace piper::runtime::hal
