// The linear launchers for the host emulation.
#include "runtime/hal/gpu/HostExec.h"
#include "runtime/hal/gpu/LinearLaunch.h"

namespace piper::runtime::hal::PIPER_GPU_NS {
using Exec = HostExec;
}

#include "runtime/hal/gpu/LinearLaunch.inl"
