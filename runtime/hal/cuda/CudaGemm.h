// A stream's GEMM state on CUDA (CudaGemm.cpp): the growable device scratch
// its bf16 operand copies and cuBLASLt's workspace live in, and the
// cuBLASLt handle and prepared GEMMs that gemmColMajor (GpuApi.h) finds
// behind gpu::Context::blas. CudaApi.cpp's per-stream resources hold them.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDAGEMM_H
#define PIPER_RUNTIME_HAL_CUDA_CUDAGEMM_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/gpu/GpuApi.h"

namespace piper::runtime::hal {

/// Device scratch that grows to the largest request.
class CudaWorkspace final : public gpu::Workspace {
public:
  CudaWorkspace(int ordinal, cudaStream_t &stream)
      : ordinal(ordinal), stream(stream) {}
  ~CudaWorkspace() override {
    if (block)
      cudaFree(block);
    for (void *old : retired)
      cudaFree(old);
  }
  /// From now on a block outgrown is kept until the workspace is destroyed
  /// instead of freed: work captured from a step (Device::beginStepCapture)
  /// addresses it whenever the capture is launched, and a capturing stream
  /// cannot wait for its work.
  void keepBlocks() { keep = true; }
  Status reserve(size_t bytes, void *&ptr) override {
    if (bytes > size) {
      if (block && keep) {
        retired.push_back(block);
        block = nullptr;
        size = 0;
      } else if (block) {
        // Work queued before may still use the old block.
        PIPER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
        PIPER_CUDA_RETURN_IF_ERROR(cudaFree(block));
        block = nullptr;
        size = 0;
      }
      size_t want = bytes < (1u << 20) ? (1u << 20) : bytes + bytes / 4;
      PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
      PIPER_CUDA_RETURN_IF_ERROR(cudaMalloc(&block, want));
      size = want;
    }
    ptr = block;
    return Status::ok();
  }

private:
  int ordinal;
  cudaStream_t &stream; // the stream of the latest context()
  void *block = nullptr;
  size_t size = 0;
  bool keep = false;
  std::vector<void *> retired;
};

/// A stream's cuBLASLt state: its handle (made at its first GEMM), its
/// prepared GEMMs, and the scratch of its bf16 operand copies. Destroying it
/// destroys what cuBLASLt made.
struct CudaBlas;
struct CudaBlasDeleter {
  void operator()(CudaBlas *blas) const;
};
using CudaBlasPtr = std::unique_ptr<CudaBlas, CudaBlasDeleter>;
/// A stream's cuBLASLt state whose operand copies go to `operands`.
CudaBlasPtr createCudaBlas(CudaWorkspace *operands);

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDAGEMM_H
