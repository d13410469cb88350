// The CUDA backend's gelu forward kernel: one thread per element (grid-stride),
// the math shared with the host (GeluMath.h).
#include "runtime/hal/cuda/CudaKernels.h"
#include "runtime/hal/cuda/GeluMath.h"

#include <cuda_runtime.h>

namespace piper::runtime::hal {

namespace {
__global__ void geluKernel(const float *__restrict__ x, float *__restrict__ y,
                           int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = cudamath::geluForward(x[i]);
}
} // namespace

cudaError_t launchGelu(const float *x, float *y, int64_t n,
                       cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535 * 8)
    blocks = 65535 * 8;
  geluKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

} // namespace piper::runtime::hal
