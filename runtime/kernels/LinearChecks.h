// Operand and attribute checks of the linear kernels, shared by the CPU
// kernels and the GPU kernels (runtime/hal/gpu). (Being filled in.)
#ifndef PIPER_RUNTIME_KERNELS_LINEARCHECKS_H
#define PIPER_RUNTIME_KERNELS_LINEARCHECKS_H

#include "runtime/kernels/KernelUtil.h"

namespace piper::runtime::detail {} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_LINEARCHECKS_H
