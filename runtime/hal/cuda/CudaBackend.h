// The CUDA backend of the HAL, as the launcher sees it: whether it can run
// here, and its Device. Built in two forms (runtime/hal/BUILD): with the CUDA
// toolkit (CudaDevice.cpp) or without it (CudaUnavailable.cpp, where every
// entry point says the build has no CUDA). Includes no CUDA header.
//
// The device: memory (the plan's arena, one plain cudaMalloc), one CUDA
// stream per logical stream, CUDA events for cross-stream waits, host <->
// device copies, and the GPU kernel layer (runtime/hal/gpu) on CUDA with
// cuBLASLt loaded at run time. See docs/gpu.md.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDABACKEND_H
#define PIPER_RUNTIME_HAL_CUDA_CUDABACKEND_H

#include <memory>

#include "runtime/hal/Hal.h"

namespace piper::runtime::hal {

/// Whether this binary was built with the CUDA toolkit.
bool cudaBackendBuilt();

/// Ok when `--backend cuda` can run here: built with CUDA and at least one
/// CUDA device visible (cudaGetDeviceCount). Otherwise says why: no CUDA in
/// this build, or CUDA's own error (e.g. cudaErrorInsufficientDriver on a
/// machine without a driver), with file and line.
Status checkCudaBackend();

/// The number of CUDA devices, or an error as checkCudaBackend.
Status cudaDeviceCount(int &count);

/// A Device on CUDA device `ordinal` using `comm` (not owned; may be null
/// for a single rank). Null with `status` set when it cannot be created.
std::unique_ptr<Device> createCudaDevice(int ordinal, Communicator *comm,
                                         Status &status,
                                         const DeviceOptions &options = {});

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDABACKEND_H
