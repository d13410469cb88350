// The moe GPU kernels. (Being filled in.)
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/MoeLaunch.h"
#include "runtime/kernels/MoeChecks.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

void addMoeKernels(std::vector<KernelEntry> &) {}

} // namespace piper::runtime::hal::PIPER_GPU_NS
