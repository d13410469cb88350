// The linear launchers for CUDA.
#include "runtime/hal/gpu/CudaExec.cuh"
#include "runtime/hal/gpu/LinearLaunch.h"

namespace piper::runtime::hal::PIPER_GPU_NS {
using Exec = CudaExec;
}

#include "runtime/hal/gpu/LinearLaunch.inl"
