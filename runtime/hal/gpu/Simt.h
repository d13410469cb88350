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
#include <type_traits>

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
///
/// Every lanes type (HostLanes, WarpLanes, and the 32-thread test lanes of
/// host/LanesExec.h) offers: lane(), kCount, sum and max (the result in
/// every lane), shuffleXor / shuffleUp / shuffle (the value of lane ^ mask /
/// lane - delta / lane src; only for lanes that exist: loops over lanes run
/// below kCount),
/// match (the lanes whose key equals this lane's, bit j for lane j),
/// maskBelow (the lanes below this one) and sync (orders the lanes' memory
/// accesses before it before those after it). Every lane must reach every
/// call of these but lane().
struct HostLanes {
  static constexpr int kCount = 1;
  PIPER_HOST_DEVICE int lane() const { return 0; }
  template <class T> PIPER_HOST_DEVICE T sum(T v) const { return v; }
  PIPER_HOST_DEVICE float max(float v) const { return v; }
  template <class T> PIPER_HOST_DEVICE T shuffleXor(T v, int) const {
    return v;
  }
  template <class T> PIPER_HOST_DEVICE T shuffleUp(T v, int) const {
    return v;
  }
  template <class T> PIPER_HOST_DEVICE T shuffle(T v, int) const { return v; }
  PIPER_HOST_DEVICE uint32_t match(int) const { return 1u; }
  PIPER_HOST_DEVICE uint32_t maskBelow() const { return 0u; }
  PIPER_HOST_DEVICE void sync() const {}
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
    for (int o = kCount / 2; o > 0; o >>= 1)
      v += shuffleXor(v, o);
#endif
    return v;
  }
  PIPER_HOST_DEVICE float max(float v) const {
#ifdef __CUDA_ARCH__
    for (int o = kCount / 2; o > 0; o >>= 1)
      v = fmaxf(v, shuffleXor(v, o));
#endif
    return v;
  }
  // 64-bit integers travel as long long (the shuffles' own overloads).
  template <class T>
  using Word = std::conditional_t<sizeof(T) == 8 && std::is_integral<T>::value,
                                  long long, T>;
  template <class T> PIPER_HOST_DEVICE T shuffleXor(T v, int mask) const {
#ifdef __CUDA_ARCH__
    v = static_cast<T>(__shfl_xor_sync(0xffffffffu, Word<T>(v), mask));
#endif
    return v;
  }
  template <class T> PIPER_HOST_DEVICE T shuffleUp(T v, int delta) const {
#ifdef __CUDA_ARCH__
    v = static_cast<T>(__shfl_up_sync(0xffffffffu, Word<T>(v), delta));
#endif
    return v;
  }
  /// The value of lane `src` (< kCount), in every lane.
  template <class T> PIPER_HOST_DEVICE T shuffle(T v, int src) const {
#ifdef __CUDA_ARCH__
    v = static_cast<T>(__shfl_sync(0xffffffffu, Word<T>(v), src));
#endif
    return v;
  }
  PIPER_HOST_DEVICE uint32_t match(int key) const {
#ifdef __CUDA_ARCH__
    return __match_any_sync(0xffffffffu, key);
#else
    return 1u;
#endif
  }
  PIPER_HOST_DEVICE uint32_t maskBelow() const {
#ifdef __CUDA_ARCH__
    return (1u << (threadIdx.x & 31)) - 1u;
#else
    return 0u;
#endif
  }
  PIPER_HOST_DEVICE void sync() const {
#ifdef __CUDA_ARCH__
    __syncwarp();
#endif
  }
};
#endif

/// The number of set bits.
PIPER_HOST_DEVICE inline int popCount(uint32_t mask) {
#ifdef __CUDA_ARCH__
  return __popc(mask);
#else
  return __builtin_popcount(mask);
#endif
}

/// The sum of v over this lane and the lanes below it.
template <class Lanes, class T>
PIPER_HOST_DEVICE T inclusiveScan(const Lanes &lanes, T v) {
  for (int o = 1; o < Lanes::kCount; o <<= 1) {
    T t = lanes.shuffleUp(v, o);
    if (lanes.lane() >= o)
      v += t;
  }
  return v;
}

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
