// What the GPU kernel layer (runtime/hal/gpu) needs on CUDA, per logical
// stream: scratch memory and cuBLASLt (loaded at run time, so piper-run has
// no link-time dependency on it). CudaApi.cpp implements the layer's
// primitives (GpuApi.h) with them, CudaGemm.cpp its GEMMs.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDAKERNELCONTEXT_H
#define PIPER_RUNTIME_HAL_CUDA_CUDAKERNELCONTEXT_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/hal/Hal.h"
#include "runtime/hal/LaunchTimes.h"

#include "runtime/hal/gpu/GpuApi.h"

namespace piper::runtime::hal {

/// Loads libcublasLt (once: `$PIPER_CUBLASLT_LIBRARY` alone when set, else
/// the loader's search for libcublasLt.so.13, then /usr/local/cuda/lib64)
/// and says what was tried when it cannot.
Status loadCublasLt();

/// The alignment in bytes cuBLASLt may assume of a matrix at `ptr` with
/// leading dimension `ld` (elements of `elementBytes`): the lowest set bit
/// of the pointer and of the column stride in bytes, at most 256, the
/// alignment cuBLASLt's heuristic assumes unless told
/// (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, which GEMMs set from it).
uint32_t matrixAlignment(const void *ptr, int64_t ld, size_t elementBytes);

class CudaLaunchTimer;

/// The launch timers of one device's streams (piper-run --profile=gpu) and
/// what they measured: each stream's timer records CUDA events around its
/// launches; collect() reads them once the streams are synchronized.
class CudaLaunchTimers {
public:
  void add(CudaLaunchTimer *timer);
  void remove(CudaLaunchTimer *timer);
  /// Adds every launch recorded since the last collect to the totals.
  Status collect();
  LaunchTimes times() const;
  void reset();

private:
  mutable std::mutex mu;
  std::vector<CudaLaunchTimer *> timers;
  LaunchTimeTotals totals;
};

/// The per-stream resources of the GPU kernels on CUDA device `ordinal`:
/// two growable scratch blocks (the kernels', and the GEMMs' bf16 operands
/// and cuBLASLt workspace, so a kernel may keep its scratch across a GEMM)
/// and a cuBLASLt handle. Not thread-safe: one per stream.
class CudaKernelResources {
public:
  /// `attention`: how the kernels run attention (gpu::Context::attention);
  /// `timers`: where its launch timer registers (null: launches are not
  /// timed).
  CudaKernelResources(int ordinal, gpu::AttentionMode attention,
                      CudaLaunchTimers *timers = nullptr);
  ~CudaKernelResources();
  /// The kernels' context for work queued on `stream`.
  gpu::Context context(cudaStream_t stream, bool bf16);
  /// While the stream captures a step: the constant tables' refills go to
  /// `refills` (null: the capture ended), and from the first capture on the
  /// scratch blocks outgrown are kept, not freed (CudaWorkspace::
  /// keepBlocks).
  void setCapture(std::vector<gpu::ConstantRefill> *refills);

private:
  struct State;
  std::unique_ptr<State> state;
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDAKERNELCONTEXT_H
