// Launchers of the layer GPU kernels (LayerLaunch.inl). (Being filled in.)
#ifndef PIPER_RUNTIME_HAL_GPU_LAYERLAUNCH_H
#define PIPER_RUNTIME_HAL_GPU_LAYERLAUNCH_H

#include <cstdint>

#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_LAYERLAUNCH_H
