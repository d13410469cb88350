// A step captured on CUDA (Device::beginStepCapture, docs/runtime.md §8):
// one CUDA graph of every stream's work, forked from the first stream's
// and joined back to it, instantiated once and launched on the first
// stream after the constant tables' host blocks are rewritten for the
// launched step. The device (CudaDevice.cpp) owns the streams; this file
// owns the capture.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDASTEPGRAPH_H
#define PIPER_RUNTIME_HAL_CUDA_CUDASTEPGRAPH_H

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/hal/Hal.h"
#include "runtime/hal/gpu/GpuApi.h"

namespace piper::runtime::hal {

/// One stream of a capture: its CUDA stream, and how its worker starts
/// capturing (`capture` its number, `refills` where its constant tables'
/// refills go) and stops (0, null), for the work enqueued after the call.
struct CudaCaptureStream {
  cudaStream_t handle = nullptr;
  std::function<void(uint64_t capture,
                     std::vector<gpu::ConstantRefill> *refills)>
      setCapture;
};

class CudaStepGraph;

/// A capture under way.
class CudaStepCapture {
public:
  ~CudaStepCapture();
  /// Begins capture number `id` (from 1) of `streams` (at least one, idle)
  /// on device `ordinal`.
  static Status begin(int ordinal, uint64_t id,
                      std::vector<CudaCaptureStream> streams,
                      std::unique_ptr<CudaStepCapture> &out);
  /// Ends it (the streams' host work has run) into `graph`; on an error the
  /// streams run their work again and `graph` is null.
  static Status end(std::unique_ptr<CudaStepCapture> capture,
                    std::unique_ptr<StepGraph> &graph);

private:
  friend class CudaStepGraph;
  CudaStepCapture() = default;

  int ordinal = 0;
  std::vector<CudaCaptureStream> streams;
  cudaStream_t origin = nullptr; // streams[0]'s
  /// Per stream, the constant tables' refills its capture kept.
  std::vector<std::vector<gpu::ConstantRefill>> refills;
  /// The fork (recorded on the origin), then a join per other stream.
  std::vector<cudaEvent_t> events;
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDASTEPGRAPH_H
