// The CUDA backend's sums in device memory, internal to it: the gradients'
// sums of squares with the clip factor (hal::SquareSums) and the loss
// accumulators (hal::LossSums). Each owns one cudaMalloc outside the arena;
// its work is queued on the calling stream of its device (`context`).
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDASUMS_H
#define PIPER_RUNTIME_HAL_CUDA_CUDASUMS_H

#include <functional>
#include <memory>

#include "runtime/hal/Hal.h"
#include "runtime/hal/gpu/GpuApi.h"

namespace piper::runtime::hal {

/// The device's kernel context for the calling stream (CudaDevice::context).
using ContextOf = std::function<gpu::Context()>;

/// Sums of squares of `slots` slots on device `ordinal`.
Status createCudaSquareSums(int ordinal, int slots, ContextOf context,
                            Allocator &memory,
                            std::unique_ptr<SquareSums> &sums);
/// `slots` loss accumulators (checkLossSlots) on device `ordinal`, zeroed.
Status createCudaLossSums(int ordinal, int slots, ContextOf context,
                          Allocator &memory, std::unique_ptr<LossSums> &sums);

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDASUMS_H
