// The layer launchers' bodies, written once: included by Layer.cu (Exec =
// CudaExec) and LayerHost.cpp (Exec = HostExec). (Being filled in.)

namespace piper::runtime::hal::PIPER_GPU_NS {} // namespace piper::runtime::hal::PIPER_GPU_NS
