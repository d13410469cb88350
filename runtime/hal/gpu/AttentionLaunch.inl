// The attention launchers' bodies, written once: included by Attention.cu (Exec =
// CudaExec) and AttentionHost.cpp (Exec = HostExec). (Being filled in.)

namespace piper::runtime::hal::PIPER_GPU_NS {} // namespace piper::runtime::hal::PIPER_GPU_NS
