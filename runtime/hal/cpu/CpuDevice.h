// The CPU backend of the HAL: host memory with a caching allocator, streams
// as persistent worker threads, events as per-event atomics and condition
// variables, the C++ kernel registry and a caller-provided communicator.
#ifndef PIPER_RUNTIME_HAL_CPU_CPUDEVICE_H
#define PIPER_RUNTIME_HAL_CPU_CPUDEVICE_H

#include <memory>

#include "runtime/hal/Hal.h"

namespace piper::runtime::hal {

/// A CPU device using `comm` (not owned; may be null for a single rank).
///
/// Kernels run on the thread of the stream that calls them and parallelize
/// through the kernels' shared pool (as many threads as OpenBLAS uses): a
/// loop takes the pool when it is free and otherwise runs on its own
/// stream's thread, so concurrent streams never oversubscribe the cores.
std::unique_ptr<Device> createCpuDevice(Communicator *comm);

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CPU_CPUDEVICE_H
