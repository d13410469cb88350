// The attention GPU kernels. (Being filled in.)
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/AttentionLaunch.h"
#include "runtime/kernels/AttentionChecks.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

void addAttentionKernels(std::vector<KernelEntry> &) {}

} // namespace piper::runtime::hal::PIPER_GPU_NS
