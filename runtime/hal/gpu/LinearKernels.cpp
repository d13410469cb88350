// The linear GPU kernels. (Being filled in.)
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/LinearLaunch.h"
#include "runtime/kernels/LinearChecks.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

void addLinearKernels(std::vector<KernelEntry> &) {}

} // namespace piper::runtime::hal::PIPER_GPU_NS
