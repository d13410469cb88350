// Vectorized reductions shared by the kernels (see VecMath.h).
#include "runtime/kernels/VecMath.h"

namespace piper::runtime::detail {

PIPER_SIMD double sumDouble(const float *x, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l)
      acc[l] += x[i + l];
  for (int l = 0; i < n; ++i, ++l)
    acc[l] += x[i];
  double s = 0;
  for (int l = 0; l < kLanes; ++l)
    s += acc[l];
  return s;
}

PIPER_SIMD double dotDouble(const float *x, const float *y, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l)
      acc[l] += double(x[i + l]) * double(y[i + l]);
  for (int l = 0; i < n; ++i, ++l)
    acc[l] += double(x[i]) * double(y[i]);
  double s = 0;
  for (int l = 0; l < kLanes; ++l)
    s += acc[l];
  return s;
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

PIPER_SIMD float maxOf(const float *x, int64_t n) {
  constexpr int kMaxLanes = 16;
  float m[kMaxLanes];
  for (int l = 0; l < kMaxLanes; ++l)
    m[l] = x[0];
  int64_t i = 0;
  for (; i + kMaxLanes <= n; i += kMaxLanes)
    for (int l = 0; l < kMaxLanes; ++l)
      m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
  for (; i < n; ++i)
    m[0] = x[i] > m[0] ? x[i] : m[0];
  float r = m[0];
  for (int l = 1; l < kMaxLanes; ++l)
    r = m[l] > r ? m[l] : r;
  return r;
}

PIPER_SIMD double expShiftedSum(const float *x, float shift, float *y,
                                int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = fastExp(x[i] - shift);
  return sumDouble(y, n);
}

PIPER_SIMD void scaleInPlace(float *y, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] *= scale;
}

} // namespace piper::runtime::detail
