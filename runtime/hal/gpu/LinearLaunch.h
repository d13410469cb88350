// Launchers of the linear GPU kernels (LinearLaunch.inl). (Being filled in.)
#ifndef PIPER_RUNTIME_HAL_GPU_LINEARLAUNCH_H
#define PIPER_RUNTIME_HAL_GPU_LINEARLAUNCH_H

#include <cstdint>

#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_LINEARLAUNCH_H
