// Internal to runtime/kernels: loops the compiler vectorizes, for the
// elementwise and row-wise kernels (docs/performance.md).
//
// Functions marked PIPER_SIMD are compiled three times (baseline x86-64,
// x86-64-v3 = AVX2, x86-64-v4 = AVX-512) and the loader picks the best one
// for the CPU. The kernels library is built with -O3 -ffp-contract=off: no
// fused multiply-adds and no reassociation, so every clone computes exactly
// the same floats and results stay deterministic.
//
// Reductions keep the kernels' rule "accumulate in double in a fixed order":
// sums run in kLanes interleaved double accumulators (element i goes to lane
// i % kLanes, lanes are added in order at the end), a fixed order that does
// not depend on the CPU or on threads.
#ifndef PIPER_RUNTIME_KERNELS_VECMATH_H
#define PIPER_RUNTIME_KERNELS_VECMATH_H

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PIPER_SIMD                                                             \
  __attribute__((target_clones("default", "arch=x86-64-v3",                  \
                               "arch=x86-64-v4")))
#else
#define PIPER_SIMD
#endif
#define PIPER_INLINE inline __attribute__((always_inline))

namespace piper::runtime::detail {

constexpr int kLanes = 8;

/// Elements per parallelFor chunk of the elementwise loops (1 MiB of
/// floats): large enough that waking a thread costs little.
constexpr int64_t kElementGrain = 1 << 18;
/// Rows per parallelFor chunk of a row-wise loop over rows of `width`
/// elements: about kElementGrain / 4 elements per chunk.
inline int64_t rowGrain(int64_t width) {
  int64_t rows = (kElementGrain / 4) / (width > 0 ? width : 1);
  return rows > 0 ? rows : 1;
}

PIPER_INLINE float bitsToFloat(int32_t i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
PIPER_INLINE int32_t floatToBits(float f) {
  int32_t i;
  std::memcpy(&i, &f, 4);
  return i;
}

/// exp(x) in float, vectorizable: Cephes' expf (range reduction by ln 2 and
/// a degree-6 polynomial, within 2 ulp). exp(x) = +inf above 88.72, 0 below
/// -87.33 (where float's normal range ends) and NaN for NaN.
PIPER_INLINE float fastExp(float x) {
  const float hi = 88.7228317f, lo = -87.3365479f;
  float c = x > hi ? hi : x;
  c = c < lo ? lo : c;
  // n = round(c / ln 2) via the 1.5 * 2^23 trick (round to nearest even).
  const float magic = 12582912.0f;
  float k = c * 1.44269504088896341f + magic;
  int32_t n = floatToBits(k) - floatToBits(magic);
  float fn = k - magic;
  float r = c - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * (r * r) + r + 1.0f;
  // y is in [0.7, 1.5]: adding n to its exponent multiplies by 2^n, and
  // n >= -126 keeps the result normal.
  float result = bitsToFloat(floatToBits(y) + n * (1 << 23));
  result = x > hi ? __builtin_inff() : result;
  result = x < lo ? 0.0f : result;
  return x != x ? x : result;
}

/// 1 / (1 + exp(-x)), in float.
PIPER_INLINE float fastSigmoid(float x) { return 1.0f / (1.0f + fastExp(-x)); }

/// tanh(x) in float, absolute error below 1e-7: (1 - e) / (1 + e) with
/// e = exp(-2|x|) <= 1, so nothing overflows.
PIPER_INLINE float fastTanh(float x) {
  float ax = x < 0 ? -x : x;
  float e = fastExp(-2.0f * ax);
  float t = (1.0f - e) / (1.0f + e);
  return x < 0 ? -t : t;
}

// Inline forms of the reductions below, for PIPER_SIMD loops that call them
// per row (the out-of-line forms cost an indirect call each).

PIPER_INLINE double sumDoubleInline(const float *x, int64_t n) {
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

PIPER_INLINE double dotDoubleInline(const float *x, const float *y,
                                    int64_t n) {
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

PIPER_INLINE float maxOfInline(const float *x, int64_t n) {
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

/// Sum of x[0..n) in double (kLanes interleaved accumulators).
double sumDouble(const float *x, int64_t n);
/// Sum of x[i] * y[i] in double (kLanes interleaved accumulators).
double dotDouble(const float *x, const float *y, int64_t n);
/// Sum of (x[i] - mean)^2 in double (kLanes interleaved accumulators).
double sumSquaredDeviation(const float *x, int64_t n, double mean);
/// Largest element of x[0..n), n >= 1 (NaN-free input assumed; the result
/// is the same element for any order).
float maxOf(const float *x, int64_t n);
/// y[i] = exp(x[i] - shift) in float (x == y allowed); returns their sum in
/// double (kLanes interleaved accumulators).
double expShiftedSum(const float *x, float shift, float *y, int64_t n);
/// y[i] = a[i] + b[i] (position_add's rows, add).
void addVectors(const float *a, const float *b, float *y, int64_t n);
/// acc[j] += row[j] (float into double), per column: the order over rows
/// is the caller's and each column's sum stays sequential (column sums:
/// embedding, position and bias gradients).
void addRowToSums(double *acc, const float *row, int64_t n);
/// out[j] = sum[j] rounded to float.
void sumsToFloat(const double *sum, float *out, int64_t n);

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_VECMATH_H
