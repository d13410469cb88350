// CUDA error reporting for the CUDA backend (builds with the toolkit only):
// every error names the call, the file and line, and CUDA's own message.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDACHECK_H
#define PIPER_RUNTIME_HAL_CUDA_CUDACHECK_H

#include <cuda_runtime_api.h>

#include <string>

#include "runtime/support/Status.h"

namespace piper::runtime::hal {

/// "cudaMalloc(&p, n): cudaErrorMemoryAllocation: out of memory
/// (runtime/hal/cuda/CudaDevice.cpp:42)".
std::string cudaErrorMessage(cudaError_t error, const char *call,
                             const char *file, int line);

/// The CUDA stream of the HAL Stream whose worker runs on the calling
/// thread (work a stream's function issues goes there), or null on any other
/// thread (the executor's loading, checkpoints).
cudaStream_t currentCudaStream();

} // namespace piper::runtime::hal

/// Evaluates a CUDA runtime call; on error returns a Status from the
/// enclosing function.
#define PIPER_CUDA_RETURN_IF_ERROR(call)                                       \
  do {                                                                         \
    cudaError_t piperCudaErr_ = (call);                                        \
    if (piperCudaErr_ != cudaSuccess)                                          \
      return ::piper::runtime::Status::error(                                  \
          ::piper::runtime::hal::cudaErrorMessage(piperCudaErr_, #call,        \
                                                  __FILE__, __LINE__));        \
  } while (0)

#endif // PIPER_RUNTIME_HAL_CUDA_CUDACHECK_H
