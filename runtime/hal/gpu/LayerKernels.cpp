// The layer GPU kernels. (Being filled in.)
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/LayerLaunch.h"
#include "runtime/kernels/LayerChecks.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

void addLayerKernels(std::vector<KernelEntry> &) {}

} // namespace piper::runtime::hal::PIPER_GPU_NS
