// Launchers of the CUDA backend's kernels (the .cu files beside this
// header, compiled by nvcc through cuda_library). Each queues its kernel on
// `stream` and returns the launch's error (cudaGetLastError).
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDAKERNELS_H
#define PIPER_RUNTIME_HAL_CUDA_CUDAKERNELS_H

#include <cuda_runtime_api.h>

#include <cstdint>

namespace piper::runtime::hal {

/// y[i] = gelu(x[i]) for i < n (GeluMath.h).
cudaError_t launchGelu(const float *x, float *y, int64_t n,
                       cudaStream_t stream);

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDAKERNELS_H
