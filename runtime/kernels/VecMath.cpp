// Vectorized reductions shared by the kernels (see VecMath.h).
#include "runtime/kernels/VecMath.h"

namespace piper::runtime::detail {

PIPER_SIMD double sumDouble(const float *x, int64_t n) {
  return sumDoubleInline(x, n);
}

PIPER_SIMD double dotDouble(const float *x, const float *y, int64_t n) {
  return dotDoubleInline(x, y, n);
}

PIPER_SIMD double sumSquaredDeviation(const float *x, int64_t n, double mean) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      double d = x[i + l] - mean;
      acc[l] += d * d;
    }
  for (int l = 0; i < n; ++i, ++l) {
    double d = x[i] - mean;
    acc[l] += d * d;
  }
  double s = 0;
  for (int l = 0; l < kLanes; ++l)
    s += acc[l];
  return s;
}

PIPER_SIMD float maxOf(const float *x, int64_t n) { return maxOfInline(x, n); }

PIPER_SIMD double expShiftedSum(const float *x, float shift, float *y,
                                int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = fastExp(x[i] - shift);
  return sumDoubleInline(y, n);
}

PIPER_SIMD void addVectors(const float *__restrict a, const float *__restrict b,
                           float *__restrict y, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    y[j] = a[j] + b[j];
}

PIPER_SIMD void addRowToSums(double *__restrict acc,
                             const float *__restrict row, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    acc[j] += row[j];
}

PIPER_SIMD void sumsToFloat(const double *__restrict sum, float *__restrict out,
                            int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    out[j] = static_cast<float>(sum[j]);
}

} // namespace piper::runtime::detail
