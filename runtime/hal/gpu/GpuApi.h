// The GPU kernels' view of their backend: the stream a kernel is queued on,
// scratch memory, GEMMs and a few asynchronous primitives. Two backends
// implement these functions and a binary links exactly one of them:
// runtime/hal/cuda (CUDA, cuBLASLt) and runtime/hal/gpu/host (the host
// emulation, which runs the same kernel bodies on the CPU for the tests and
// the emulated device). Includes no CUDA header.
#ifndef PIPER_RUNTIME_HAL_GPU_GPUAPI_H
#define PIPER_RUNTIME_HAL_GPU_GPUAPI_H

#include "runtime/hal/gpu/Namespace.h"

#include <cstddef>
#include <cstdint>

#include "runtime/support/Status.h"

struct CUstream_st; // cudaStream_t is CUstream_st *

namespace piper::runtime::hal::PIPER_GPU_NS {

using StreamHandle = CUstream_st *;

/// Scratch device memory of one stream: bf16 copies of GEMM operands,
/// partial sums. Kept for the stream's life (it grows to the largest
/// request, synchronizing the stream before it frees the smaller block),
/// outside the plan's arena.
class Workspace {
public:
  virtual ~Workspace() = default;
  /// At least `bytes` of device memory, 256-byte aligned, valid until the
  /// next reserve() of this workspace. Work queued on the stream before may
  /// still be using the previous block; reserve waits for it when it must
  /// free that block.
  virtual Status reserve(size_t bytes, void *&ptr) = 0;
};

/// Everything a GPU kernel call gets besides its operands.
struct Context {
  /// The CUDA stream of the calling logical stream (null: the emulation).
  StreamHandle stream = nullptr;
  Workspace *workspace = nullptr;
  /// The backend's BLAS handle (a cublasLtHandle_t on CUDA).
  void *blas = nullptr;
  /// Mixed precision: GEMMs read their operands as bf16 (they hold bf16
  /// values already) on tensor cores, accumulating in fp32.
  bool bf16 = false;
};

// Backend primitives.

/// Ok, or "<kernel>: <CUDA error name>: <message>" for a launch's error
/// (the launchers' int is a cudaError_t; 0 is success).
Status launchStatus(int error, const char *kernel);
/// Queues memset(ptr, 0, bytes) on the stream.
Status zeroAsync(const Context &ctx, void *ptr, size_t bytes);
/// Queues a device-to-device copy on the stream.
Status copyAsync(const Context &ctx, void *dst, const void *src, size_t bytes);
/// Copies device memory to host memory and returns when it is there (the
/// stream is synchronized: only for results the host needs now).
Status copyToHostSync(const Context &ctx, void *host, const void *src,
                      size_t bytes);
/// Adds scale * (device float *value) to the host double *acc when the
/// stream reaches this point, without blocking the host; the executor reads
/// *acc after synchronizing the stream.
Status addToHostAsync(const Context &ctx, const float *value, double scale,
                      double *acc);

/// A GEMM in BLAS's column-major convention: C = alpha op(A) op(B) + beta C
/// with op(A) m x k, op(B) k x n, C m x n.
struct ColMajorGemm {
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1;
  const float *a = nullptr;
  int64_t lda = 0;
  const float *b = nullptr;
  int64_t ldb = 0;
  float beta = 0;
  float *c = nullptr;
  int64_t ldc = 0;
};
/// Runs `g` (m, n, k >= 1) on the stream: fp32 (TF32 off), or with
/// ctx.bf16 bf16 operands on tensor cores with fp32 accumulation and output.
Status gemmColMajor(const Context &ctx, const ColMajorGemm &g);

/// Row-major C[m,n] = alpha op(A) op(B) + beta C, as the CPU kernels'
/// gemm (runtime/kernels/KernelUtil.h): mapped onto gemmColMajor
/// (Gemm.cpp). Empty products are handled here.
Status gemm(const Context &ctx, bool transA, bool transB, int64_t m, int64_t n,
            int64_t k, float alpha, const float *a, int64_t lda,
            const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_GPUAPI_H
