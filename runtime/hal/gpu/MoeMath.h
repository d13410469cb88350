// The math of the moe GPU kernels (MoeLaunch.inl): the router's softmax
// terms, its top-k order and its warp arg-max (through the lanes' shuffles,
// Simt.h). Compiled for the device by nvcc and for the host by g++.
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
template <class Lanes>
PIPER_HOST_DEVICE void laneRouterFirst(const Lanes &lanes, double &key,
                                       int &index) {
  for (int o = Lanes::kCount / 2; o > 0; o >>= 1) {
    double k = lanes.shuffleXor(key, o);
    int i = lanes.shuffleXor(index, o);
    if (routerBefore(k, i, key, index)) {
      key = k;
      index = i;
    }
  }
}

/// softmax(row)[e] given the row's maximum and sum of exp(x - max), in
/// double (the CPU kernel's softmaxRow).
PIPER_HOST_DEVICE inline double softmaxTerm(float x, float rowMax,
                                            double sum) {
  return exp(double(x) - rowMax) / sum;
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_MOEMATH_H
