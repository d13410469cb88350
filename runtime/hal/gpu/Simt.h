// The portable core of the GPU kernels: code that nvcc compiles for the
// device and g++ compiles for the host. A kernel body is written once, as a
// function of one row (or element) and a `Lanes` policy: on the GPU the lanes
// are the 32 threads of a warp, which stride over the row and combine their
// partial results with shuffles; on the host (HostLanes) there is one lane,
// so the same body runs sequentially in the emulated backend and in the
// tests that compare it with the CPU kernels (docs/gpu.md). Includes no CUDA
// header.
#ifndef PIPER_RUNTIME_HAL_GPU_SIMT_H
#define PIPER_RUNTIME_HAL_GPU_SIMT_H

#include "runtime/hal/gpu/Namespace.h"

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define PIPER_HOST_DEVICE __host__ __device__
/// A kernel body: `[=] PIPER_LAMBDA (int64_t i) {...}` (nvcc's extended
/// lambdas, --extended-lambda).
#define PIPER_LAMBDA __host__ __device__
#else
#define PIPER_HOST_DEVICE
#define PIPER_LAMBDA
#endif

namespace piper::runtime::hal::PIPER_GPU_NS {

/// One lane: the host's sequential execution of a warp-per-row body.
struct HostLanes {
  static constexpr int kCount = 1;
  PIPER_HOST_DEVICE int lane() const { return 0; }
  template <class T> PIPER_HOST_DEVICE T sum(T v) const { return v; }
  PIPER_HOST_DEVICE float max(float v) const { return v; }
};

#ifdef __CUDACC__
/// The 32 lanes of a warp (all active): lane j handles elements j, j + 32,
/// ...; sum and max leave the warp-wide result in every lane, combined in a
/// fixed (butterfly) order. Host-callable only so that bodies written as
/// __host__ __device__ lambdas compile; the host never runs them.
struct WarpLanes {
  static constexpr int kCount = 32;
  PIPER_HOST_DEVICE int lane() const {
#ifdef __CUDA_ARCH__
    return threadIdx.x & 31;
#else
    return 0;
#endif
  }
  template <class T> PIPER_HOST_DEVICE T sum(T v) const {
#ifdef __CUDA_ARCH__
    for (int o = 16; o > 0; o >>= 1)
      v += __shfl_xor_sync(0xffffffffu, v, o);
#endif
    return v;
  }
  PIPER_HOST_DEVICE float max(float v) const {
#ifdef __CUDA_ARCH__
    for (int o = 16; o > 0; o >>= 1)
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
#endif
    return v;
  }
};
#endif

/// *p += v, atomically on the device (the host emulation is sequential).
PIPER_HOST_DEVICE inline void atomicAddFloat(float *p, float v) {
#ifdef __CUDA_ARCH__
  atomicAdd(p, v);
#else
  *p += v;
#endif
}

/// exp(x) on both sides (expf: the device's and the host's libm differ in
/// the last ulp, far inside the tests' bounds).
PIPER_HOST_DEVICE inline float expF(float x) { return expf(x); }

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_SIMT_H
