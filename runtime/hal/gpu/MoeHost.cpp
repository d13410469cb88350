// The moe launchers for the host emulation.
#include "runtime/hal/gpu/HostExec.h"
#include "runtime/hal/gpu/MoeLaunch.h"

namespace piper::runtime::hal::PIPER_GPU_NS {
using Exec = HostExec;
}

#include "runtime/hal/gpu/MoeLaunch.inl"
