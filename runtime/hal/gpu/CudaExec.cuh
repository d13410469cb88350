// How the CUDA backend runs a kernel body (see Simt.h): one thread per index
// (grid-stride), or one warp per row. Included by the .cu files that
// instantiate the launchers (*.inl) for CUDA; the host twin is HostExec.h.
#ifndef PIPER_RUNTIME_HAL_GPU_CUDAEXEC_CUH
#define PIPER_RUNTIME_HAL_GPU_CUDAEXEC_CUH

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

namespace cudaexec {
constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
// Enough blocks to fill an H100/H200 many times over; loops stride beyond.
constexpr int64_t kMaxBlocks = 65535;

template <class F> __global__ void forEachKernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    f(i);
}

// Every lane of a warp takes the same rows, so the warp's shuffles see all
// 32 lanes. At most 128 registers per thread, so two blocks fit an SM (the
// attention passes need 96-135 otherwise; none spills at 128).
template <class F>
__global__ void __launch_bounds__(kThreads, 2)
    forEachRowKernel(int64_t rows, F f) {
  const int64_t warp = threadIdx.x / 32;
  for (int64_t r = blockIdx.x * int64_t(kWarpsPerBlock) + warp; r < rows;
       r += int64_t(gridDim.x) * kWarpsPerBlock)
    f(WarpLanes{}, r);
}

inline unsigned blocksFor(int64_t units, int64_t perBlock) {
  int64_t blocks = (units + perBlock - 1) / perBlock;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}
} // namespace cudaexec

class CudaExec {
public:
  using Lanes = WarpLanes;
  explicit CudaExec(const Context &ctx) : ctx(ctx) {}
  template <class F> Status forEach(const char *name, int64_t n, F f) const {
    if (n <= 0)
      return Status::ok();
    if (ctx.timer)
      PIPER_RETURN_IF_ERROR(ctx.timer->begin(ctx));
    cudaexec::forEachKernel<<<cudaexec::blocksFor(n, cudaexec::kThreads),
                              cudaexec::kThreads, 0, ctx.stream>>>(n, f);
    PIPER_RETURN_IF_ERROR(
        launchStatus(static_cast<int>(cudaGetLastError()), name));
    return ctx.timer ? ctx.timer->end(ctx, name) : Status::ok();
  }
  template <class F>
  Status forEachRow(const char *name, int64_t rows, F f) const {
    if (rows <= 0)
      return Status::ok();
    if (ctx.timer)
      PIPER_RETURN_IF_ERROR(ctx.timer->begin(ctx));
    cudaexec::
        forEachRowKernel<<<cudaexec::blocksFor(rows, cudaexec::kWarpsPerBlock),
                           cudaexec::kThreads, 0, ctx.stream>>>(rows, f);
    PIPER_RETURN_IF_ERROR(
        launchStatus(static_cast<int>(cudaGetLastError()), name));
    return ctx.timer ? ctx.timer->end(ctx, name) : Status::ok();
  }
  const Context &context() const { return ctx; }

private:
  const Context &ctx;
};

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_CUDAEXEC_CUH
