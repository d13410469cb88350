// The math of the linear and loss GPU kernels, compiled for the device by
// nvcc and for the host by g++ (Simt.h): a lane's running log-sum-exp for
// the softmax cross entropy, and the chunking of the column sums. Follows
// the CPU kernels (runtime/kernels/LossKernels.cpp): exponentials in float,
// their sums in double; the exp differs (expf here, the CPU's vectorized
// exp there, within 2 ulp).
#ifndef PIPER_RUNTIME_HAL_GPU_LINEARMATH_H
#define PIPER_RUNTIME_HAL_GPU_LINEARMATH_H

#include <cmath>
#include <cstdint>

#include "runtime/hal/gpu/ElementwiseMath.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

/// Rows per partial column sum of bias_grad: partials[chunk][column] in
/// double, then summed over the chunks in order (deterministic, no
/// atomics; one thread per (chunk, column), adjacent threads on adjacent
/// columns).
constexpr int64_t kColumnChunkRows = 64;

/// One lane's share of a row's softmax normalizer, in one pass: `sum` is the
/// sum of exp(x - max) over the elements seen, `max` their maximum (-inf
/// before the first). Each exponential is a float, as the CPU's; the sum is
/// double and rescaled (in double) when the maximum grows.
struct SoftmaxSum {
  float max = -INFINITY;
  double sum = 0;

  PIPER_HOST_DEVICE void add(float x) {
    if (x > max) {
      sum *= exp(double(max) - double(x));
      max = x;
    }
    // -inf adds nothing (exp(-inf - max), and max may be -inf itself); a
    // NaN adds NaN, so that it reaches the loss as on the CPU.
    if (!(x <= -INFINITY))
      sum += expF(x - max);
  }
};

/// log(sum over the row of exp(x)) from every lane's SoftmaxSum; every lane
/// must call it (it reduces across the lanes) and gets the result.
template <class Lanes>
PIPER_HOST_DEVICE inline double logSumExp(Lanes lanes, SoftmaxSum s) {
  float rowMax = lanes.max(s.max);
  // A lane without finite elements holds sum 0 (exp(-inf) = 0 scales it).
  double scaled =
      s.sum == 0 ? 0.0 : s.sum * exp(double(s.max) - double(rowMax));
  double total = lanes.sum(scaled);
  return double(rowMax) + log(total);
}

/// A row's log-sum-exp over the whole vocabulary from the summed
/// vocabulary-parallel statistics [m_j | hi_j | mid_j | lo_j | target]
/// (vocab_ce_stats, T columns each): M + log(sum_j s_j exp(m_j - M)), M the
/// largest m_j, s_j = hi_j + mid_j + lo_j; as the CPU kernels
/// (LossKernels.cpp), in double.
PIPER_HOST_DEVICE inline double statsLogSumExp(const float *stats,
                                               int64_t members) {
  float rowMax = stats[0];
  for (int64_t j = 1; j < members; ++j)
    rowMax = stats[j] > rowMax ? stats[j] : rowMax;
  double sum = 0;
  for (int64_t j = 0; j < members; ++j) {
    double s = double(stats[members + j]) + double(stats[2 * members + j]) +
               double(stats[3 * members + j]);
    if (s != 0)
      sum += s * exp(double(stats[j]) - double(rowMax));
  }
  return double(rowMax) + log(sum);
}

/// Whether a target id indexes a row of `vocab` classes. The GPU kernels
/// cannot read the targets on the host to reject bad ones (the CPU kernels
/// do; token files are checked against the vocabulary at load): a row
/// whose target is out of range skips the target term, so nothing is read
/// or written out of bounds.
PIPER_HOST_DEVICE inline bool validTarget(int32_t target, int64_t vocab) {
  return target >= 0 && target < vocab;
}

/// acc + scale * value with the product rounded before the sum, as the CPU
/// kernel (built without FMA contraction) computes it: on the GPU never one
/// fused multiply-add (loss_accumulate).
PIPER_HOST_DEVICE inline double addScaled(double acc, double scale,
                                          float value) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(acc, __dmul_rn(scale, double(value)));
#else
  return acc + scale * double(value);
#endif
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_LINEARMATH_H
