// CUDA error reporting for the CUDA backend (builds with the toolkit only):
// every error names the call, the file and line, and CUDA's own message.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDACHECK_H
#define PIPER_RUNTIME_HAL_CUDA_CUDACHECK_H

#include <cuda_runtime_api.h>

#include <string>

#include "support/Status.h"

namespace piper::runtime::hal {

/// "cudaMalloc(&p, n): cudaErrorMemoryAllocation: out of memory
/// (runtime/hal/cuda/CudaDevice.cpp:42)".
std::string cudaErrorMessage(cudaError_t error, const char *call,
                             const char *file, int line);

/// Whether `error` is one a kernel causes after its launch returned (an
/// illegal address, a launch failure, a device assert...): CUDA reports it
/// at a later call, often a synchronize, which is then not the culprit.
bool isAsynchronousKernelError(cudaError_t error);

/// The error of `call`: cudaErrorMessage, and for an asynchronous kernel
/// error the last kernel launched on the stream (`lastKernel`, when known),
/// which the call is not, e.g. "...; the last kernel launched on this stream
/// was 'attention_backward' (CUDA_LAUNCH_BLOCKING=1 names the one that
/// faulted)".
Status cudaCallError(cudaError_t error, const char *call, const char *file,
                     int line, const char *lastKernel);

/// Records `kernel` (a string that lives as long as the program) as the last
/// kernel launched from the calling thread. A HAL stream's worker issues all
/// of its stream's device work, so on a worker that is its stream's last
/// kernel.
void noteKernelLaunch(const char *kernel);
/// The last kernel noted on the calling thread, or null.
const char *lastKernelLaunched();

} // namespace piper::runtime::hal

/// Evaluates a CUDA runtime call; on error returns a Status from the
/// enclosing function (cudaCallError, naming the calling thread's last
/// kernel for an asynchronous error).
#define PIPER_CUDA_RETURN_IF_ERROR(call)                                       \
  do {                                                                         \
    cudaError_t piperCudaErr_ = (call);                                        \
    if (piperCudaErr_ != cudaSuccess)                                          \
      return ::piper::runtime::hal::cudaCallError(                             \
          piperCudaErr_, #call, __FILE__, __LINE__,                            \
          ::piper::runtime::hal::lastKernelLaunched());                        \
  } while (0)

#endif // PIPER_RUNTIME_HAL_CUDA_CUDACHECK_H
