// The namespace of the GPU kernel layer. It is compiled twice, for the CUDA
// backend (namespace gpu) and for the host emulation (namespace
// gpu_emulation, -DPIPER_GPU_NS=gpu_emulation), so one binary (piper-run)
// can hold both backends.
#ifndef PIPER_RUNTIME_HAL_GPU_NAMESPACE_H
#define PIPER_RUNTIME_HAL_GPU_NAMESPACE_H

#ifndef PIPER_GPU_NS
#define PIPER_GPU_NS gpu
#endif

#endif // PIPER_RUNTIME_HAL_GPU_NAMESPACE_H
