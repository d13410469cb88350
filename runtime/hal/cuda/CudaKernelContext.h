// What the GPU kernel layer (runtime/hal/gpu) needs on CUDA, per logical
// stream: scratch memory and cuBLASLt (loaded at run time, so piper-run has
// no link-time dependency on it). CudaApi.cpp implements the layer's
// primitives (GpuApi.h) with them.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDAKERNELCONTEXT_H
#define PIPER_RUNTIME_HAL_CUDA_CUDAKERNELCONTEXT_H

#include <cuda_runtime_api.h>

#include <memory>

#include "runtime/hal/gpu/GpuApi.h"

namespace piper::runtime::hal {

/// Loads libcublasLt (once: `$PIPER_CUBLASLT_LIBRARY` alone when set, else
/// the loader's search for libcublasLt.so.13, then /usr/local/cuda/lib64)
/// and says what was tried when it cannot.
Status loadCublasLt();

/// The per-stream resources of the GPU kernels on CUDA device `ordinal`:
/// two growable scratch blocks (the kernels', and the GEMMs' bf16 operands
/// and cuBLASLt workspace, so a kernel may keep its scratch across a GEMM)
/// and a cuBLASLt handle. Not thread-safe: one per stream.
class CudaKernelResources {
public:
  explicit CudaKernelResources(int ordinal);
  ~CudaKernelResources();
  /// The kernels' context for work queued on `stream`.
  gpu::Context context(cudaStream_t stream, bool bf16);

private:
  struct State;
  std::unique_ptr<State> state;
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDAKERNELCONTEXT_H
