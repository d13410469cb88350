// The row math of RMS norm, shared by rms_norm (NormKernels.cpp) and
// qk_norm (QkNormKernels.cpp), and how the norm kernels walk their rows.
// Reductions accumulate in double in a fixed order (VecMath.h).
#ifndef PIPER_RUNTIME_KERNELS_NORMROWS_H
#define PIPER_RUNTIME_KERNELS_NORMROWS_H

#include <cstdint>

#include "runtime/kernels/Parallel.h"
#include "runtime/kernels/VecMath.h"

namespace piper::runtime::detail {

inline constexpr double kRmsNormEps = 1e-6;

/// Runs `row(n)` for every row, chunks of rows of `width` in parallel.
template <typename Row>
void forEachRow(int64_t rows, int64_t width, const Row &row) {
  parallelFor(rows, rowGrain(width), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      row(n);
  });
}

/// 1/sqrt(mean(x^2) + eps) of one row, in double.
double rowRrms(const float *x, int64_t hidden, double eps);
/// y = x * rrms * gamma.
void rmsNormRow(const float *x, const float *gamma, float *y, int64_t hidden,
                double rrms);
/// The backward of rms_norm over `rows` rows, shared by its two halves
/// rms_norm_grad_input (dx) and rms_norm_grad_weight (dgamma). `dx` may be
/// null (then `gamma` is not read), as may `dgamma`.
void rmsNormBackward(const float *x, const float *gamma, const float *dy,
                     int64_t rows, int64_t hidden, double eps, float *dx,
                     float *dgamma);

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_NORMROWS_H
