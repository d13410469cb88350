// The GPU backend's kernels on the host: a Device with the CPU backend's
// memory, streams, events and communicator, and the GPU kernel layer
// (runtime/hal/gpu) run by its host emulation: every kernel body, launcher,
// operand check and GEMM mapping of the CUDA backend, with one lane per
// warp, sequentially. `piper-run --backend cuda-emulation` uses it, so plans
// train through the CUDA backend's code on machines without a GPU
// (docs/gpu.md). Slow: for tests. Its operations can be made to fail
// (injectEmulatedDeviceError), as a GPU's can.
#ifndef PIPER_RUNTIME_HAL_GPU_HOST_EMULATEDDEVICE_H
#define PIPER_RUNTIME_HAL_GPU_HOST_EMULATEDDEVICE_H

#include <memory>
#include <string>

#include "runtime/hal/Hal.h"

namespace piper::runtime::hal {

/// The emulated GPU device using `comm` (not owned; may be null). With
/// `options.attention` Cudnn, bf16 attention runs the fused path on a host
/// model of cuDNN's fused attention (host/HostFusedAttention.h); otherwise
/// on the SIMT kernels. The device's communicator() models NCCL's stream
/// ordering over `comm` (host/EmulatedCommunicator.h): operations issued
/// while a stream captures a step are recorded with it and, when replayed,
/// run on `direct`, the same ranks' communicator on host memory (`comm`
/// itself when null; on the cuda-emulation backend the Gloo communicator
/// that the staging `comm` wraps).
std::unique_ptr<Device>
createEmulatedGpuDevice(Communicator *comm, const DeviceOptions &options = {},
                        Communicator *direct = nullptr);

/// The synchronizing calls of every emulated device of this process so
/// far: what on CUDA makes the host wait for the GPU (a stream's
/// synchronize, a copy between host and device memory that waits:
/// Allocator::copyToHost and copyFromHost, the kernel layer's
/// copyToHostSync). Allocator::copyFromHostAsync is not one. For the test
/// that a step synchronizes only at its end.
int64_t emulatedSyncCalls();
/// Counts one synchronizing call (the emulation's own).
void countEmulatedSync();

/// Makes the next operation of an emulated device of this process (an
/// allocation, a memset or copy, a kernel, an elementwise method, a step
/// capture's beginning, instantiation or launch), or with `only` the next
/// whose name starts with it (e.g. "launching a captured step"), fail as a
/// CUDA call can: "<operation>: emulated device error (PIPER_FAULT
/// action=device_error)". For PIPER_FAULT's device_error, which shows a
/// device error reaching the watchdog as the rank's named failure, and for
/// the tests of those errors.
void injectEmulatedDeviceError(const std::string &only = "");

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_GPU_HOST_EMULATEDDEVICE_H
