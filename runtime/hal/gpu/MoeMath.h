// The math of the moe GPU kernels (MoeLaunch.inl): the router's softmax
// terms and its top-k order, and the warp primitives the slot assignment
// needs besides Simt.h's sum and max (match, prefix scan, arg-max), each
// with a one-lane host version for the emulation. Compiled for the device
// by nvcc and for the host by g++ (Simt.h). The warp versions assume all 32
// lanes take part (forEachRow runs every lane of a warp on the same rows).
#ifndef PIPER_RUNTIME_HAL_GPU_MOEMATH_H
#define PIPER_RUNTIME_HAL_GPU_MOEMATH_H

#include <cmath>
#include <cstdint>

#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

/// Assignments (n, j) per warp of the slot assignment: a warp walks its
/// chunk in order, 32 at a time, keeping per-expert counters in a table of
/// E x chunks entries (MoeLaunch.h).
constexpr int64_t kMoeSlotChunk = 1024;

PIPER_HOST_DEVICE inline int64_t moeSlotChunks(int64_t assignments) {
  return (assignments + kMoeSlotChunk - 1) / kMoeSlotChunk;
}

/// The lanes whose `key` equals this lane's (bit j: lane j).
PIPER_HOST_DEVICE inline uint32_t laneMatch(int key) {
#ifdef __CUDA_ARCH__
  return __match_any_sync(0xffffffffu, key);
#else
  (void)key;
  return 1u;
#endif
}

/// The lanes below this one (bit j: lane j).
PIPER_HOST_DEVICE inline uint32_t laneMaskBelow() {
#ifdef __CUDA_ARCH__
  return (1u << (threadIdx.x & 31)) - 1u;
#else
  return 0u;
#endif
}

PIPER_HOST_DEVICE inline int popCount(uint32_t mask) {
#ifdef __CUDA_ARCH__
  return __popc(mask);
#else
  return __builtin_popcount(mask);
#endif
}

/// Orders the lanes' global memory accesses before the barrier before those
/// after it, for every lane of the warp.
PIPER_HOST_DEVICE inline void laneSync() {
#ifdef __CUDA_ARCH__
  __syncwarp();
#endif
}

/// The sum of v over this lane and the lanes below it.
PIPER_HOST_DEVICE inline int64_t laneInclusiveScan(int64_t v) {
#ifdef __CUDA_ARCH__
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    long long t = __shfl_up_sync(0xffffffffu, static_cast<long long>(v), o);
    if (lane >= o)
      v += t;
  }
#endif
  return v;
}

// ---------------------------------------------------------------------------
// The router.

/// The router's order of experts: p descending, index ascending on ties (the
/// CPU kernel's insertion keeps the lower index on ties). A NaN p sorts last
/// (key -1; p is in [0, 1] otherwise), so k distinct experts are always
/// chosen; the CPU kernel's choice differs only with NaN logits.
PIPER_HOST_DEVICE inline double routerKey(double p) {
  return p == p ? p : -1.0;
}

/// Whether (key a, index ia) comes before (key b, index ib) in that order.
PIPER_HOST_DEVICE inline bool routerBefore(double a, int ia, double b,
                                           int ib) {
  return a > b || (a == b && ia < ib);
}

/// The first (key, index) over the lanes in the router's order, in every
/// lane.
PIPER_HOST_DEVICE inline void laneRouterFirst(double &key, int &index) {
#ifdef __CUDA_ARCH__
  for (int o = 16; o > 0; o >>= 1) {
    double k = __shfl_xor_sync(0xffffffffu, key, o);
    int i = __shfl_xor_sync(0xffffffffu, index, o);
    if (routerBefore(k, i, key, index)) {
      key = k;
      index = i;
    }
  }
#else
  (void)key;
  (void)index;
#endif
}

/// softmax(row)[e] given the row's maximum and sum of exp(x - max), in
/// double (the CPU kernel's softmaxRow).
PIPER_HOST_DEVICE inline double softmaxTerm(float x, float rowMax,
                                            double sum) {
  return exp(double(x) - rowMax) / sum;
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_MOEMATH_H
