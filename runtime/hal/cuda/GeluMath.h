// The math of the CUDA backend's gelu kernel (GeluKernel.cu), one function
// compiled both for the device (by nvcc) and for the host (by g++), so that
// gelu_math_test checks it against the CPU kernel on every machine, GPU or
// not. Includes no CUDA header.
#ifndef PIPER_RUNTIME_HAL_CUDA_GELUMATH_H
#define PIPER_RUNTIME_HAL_CUDA_GELUMATH_H

#include <cmath>

#ifdef __CUDACC__
#define PIPER_HOST_DEVICE __host__ __device__
#else
#define PIPER_HOST_DEVICE
#endif

namespace piper::runtime::hal::cudamath {

/// GPT-2's tanh approximation, as the CPU kernel computes it:
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), with
/// tanh(u) = (1 - e) / (1 + e), e = exp(-2|u|) <= 1 (nothing overflows).
/// The CPU kernel's exp is its own vectorized one (runtime/kernels/VecMath.h,
/// tanh within 1e-7 absolute); this one uses expf. gelu_math_test bounds
/// the difference.
PIPER_HOST_DEVICE inline float geluForward(float x) {
  const float c = 0.7978845608028654f; // sqrt(2 / pi)
  const float a = 0.044715f;
  float u = c * (x + a * x * x * x);
  float au = u < 0 ? -u : u;
  float e = expf(-2.0f * au);
  float t = (1.0f - e) / (1.0f + e);
  t = u < 0 ? -t : t;
  return 0.5f * x * (1.0f + t);
}

} // namespace piper::runtime::hal::cudamath

#endif // PIPER_RUNTIME_HAL_CUDA_GELUMATH_H
