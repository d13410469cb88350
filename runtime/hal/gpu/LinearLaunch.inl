// The linear launchers' bodies, written once: included by Linear.cu (Exec =
// CudaExec) and LinearHost.cpp (Exec = HostExec). (Being filled in.)

namespace piper::runtime::hal::PIPER_GPU_NS {} // namespace piper::runtime::hal::PIPER_GPU_NS
