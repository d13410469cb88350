// The moe launchers' bodies, written once: included by Moe.cu (Exec =
// CudaExec) and MoeHost.cpp (Exec = HostExec). (Being filled in.)

namespace piper::runtime::hal::PIPER_GPU_NS {} // namespace piper::runtime::hal::PIPER_GPU_NS
