// The math of the elementwise GPU kernels (gelu, swiglu, AdamW, bf16
// rounding), one function per element, compiled for the device by nvcc and
// for the host by g++ (Simt.h). Each follows its CPU kernel
// (runtime/kernels) operation for operation; the exp differs (expf here,
// the CPU's own vectorized exp there), within 1e-7 absolute on tanh and
// sigmoid.
#ifndef PIPER_RUNTIME_HAL_GPU_ELEMENTWISEMATH_H
#define PIPER_RUNTIME_HAL_GPU_ELEMENTWISEMATH_H

#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/hal/gpu/Simt.h"
#include "runtime/kernels/AdamwConstants.h"
#include "runtime/kernels/ClipFactor.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

constexpr float kGeluC = 0.7978845608028654f; // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

/// tanh(u) = (1 - e) / (1 + e), e = exp(-2|u|) <= 1: nothing overflows.
PIPER_HOST_DEVICE inline float tanhF(float u) {
  float au = u < 0 ? -u : u;
  float e = expF(-2.0f * au);
  float t = (1.0f - e) / (1.0f + e);
  return u < 0 ? -t : t;
}

PIPER_HOST_DEVICE inline float sigmoidF(float x) {
  return 1.0f / (1.0f + expF(-x));
}

/// GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
PIPER_HOST_DEVICE inline float geluForward(float x) {
  float t = tanhF(kGeluC * (x + kGeluA * x * x * x));
  return 0.5f * x * (1.0f + t);
}

/// dy * gelu'(x).
PIPER_HOST_DEVICE inline float geluBackward(float x, float dy) {
  float t = tanhF(kGeluC * (x + kGeluA * x * x * x));
  float dInner = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  float dGelu = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dInner;
  return dGelu * dy;
}

/// silu(gate) * up.
PIPER_HOST_DEVICE inline float swigluForward(float gate, float up) {
  return gate * sigmoidF(gate) * up;
}

/// The gradients of swigluForward: dgate and dup.
PIPER_HOST_DEVICE inline void swigluBackward(float gate, float up, float dy,
                                             float &dgate, float &dup) {
  float sig = sigmoidF(gate);
  // silu'(g) = sig (1 + g (1 - sig)).
  dgate = dy * up * (sig * (1.0f + gate * (1.0f - sig)));
  dup = dy * (gate * sig);
}

/// One element of AdamW with decoupled weight decay, in double.
PIPER_HOST_DEVICE inline void adamwElement(const runtime::AdamwConstants &c,
                                           float grad, float &param, float &m,
                                           float &v) {
  const double step = c.lr / c.correction1, inv2 = 1.0 / c.correction2;
  double g = grad;
  double p = param;
  p -= c.decay * p;
  double mi = c.beta1 * m + (1.0 - c.beta1) * g;
  double vi = c.beta2 * v + (1.0 - c.beta2) * g * g;
  p -= step * mi / (sqrt(vi * inv2) + c.eps);
  param = static_cast<float>(p);
  m = static_cast<float>(mi);
  v = static_cast<float>(vi);
}

PIPER_HOST_DEVICE inline uint32_t floatBits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
#endif
}

PIPER_HOST_DEVICE inline float bitsFloat(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
#endif
}

/// The bf16 bits of x, rounded to nearest even; NaN stays a quiet NaN (as
/// support/Precision.h's floatToBf16).
PIPER_HOST_DEVICE inline uint16_t toBf16(float x) {
  uint32_t bits = floatBits(x);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu))
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

PIPER_HOST_DEVICE inline float fromBf16(uint16_t b) {
  return bitsFloat(static_cast<uint32_t>(b) << 16);
}

/// A row (from element `at`) of an operand given fp32 or packed (bf16,
/// Device::readsPackedInput; one of the two pointers is null): element j
/// is the same value either way.
struct RowIn {
  // NOLINTNEXTLINE: implicit from an fp32 pointer on purpose.
  PIPER_HOST_DEVICE RowIn(const float *f32 = nullptr,
                          const uint16_t *bf16 = nullptr, int64_t at = 0)
      : f32(f32), bf16(bf16), at(at) {}
  const float *f32;
  const uint16_t *bf16;
  int64_t at;
  PIPER_HOST_DEVICE float operator[](int64_t j) const {
    return bf16 ? fromBf16(bf16[at + j]) : f32[at + j];
  }
};

/// v, or v rounded to bf16 (the executor's rounding, launchRoundBf16's
/// bits) where a mixed-precision kernel stores its results rounded
/// (Device::roundsOutputs).
PIPER_HOST_DEVICE inline float roundedIf(float v, bool round) {
  return round ? fromBf16(toBf16(v)) : v;
}

/// Stores element i of an output that is fp32 (`out`, rounded with
/// `round`) or packed bf16 (`out16` not null: the same value rounded,
/// packed; Device::writesPackedOutput).
PIPER_HOST_DEVICE inline void storeRounded(float *out, uint16_t *out16,
                                           int64_t i, float v, bool round) {
  if (out16)
    out16[i] = toBf16(v);
  else
    out[i] = roundedIf(v, round);
}

/// Whether `x` is finite (neither infinite nor NaN), from its bits.
PIPER_HOST_DEVICE inline bool finiteFloat(float x) {
  return (floatBits(x) & 0x7F800000u) != 0x7F800000u;
}

/// The entry of a batch (of AdamW updates, of arrays to measure) that
/// element or chunk `i` belongs to: the last of the `count` (>= 1)
/// ascending `starts` at or before `i` (an empty entry starts where the next
/// one does, so the one holding `i` is the last).
PIPER_HOST_DEVICE inline int batchEntryOf(const int64_t *starts, int count,
                                          int64_t i) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (starts[mid] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/// Elements per partial sum of sumOfSquares: the partials (one warp each, in
/// double, a fixed order) are then added by one warp, so the result does
/// not depend on the launch.
constexpr int64_t kSquaresChunk = 1 << 14;

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_ELEMENTWISEMATH_H
