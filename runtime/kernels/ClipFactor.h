// The clip factor of a clipped step (CLIP_GRADS), shared by the host
// (hal::SquareSums on the CPU) and the GPU kernels (runtime/hal/gpu, host
// and device code), so that both compute it with the same expression.
#ifndef PIPER_RUNTIME_KERNELS_CLIPFACTOR_H
#define PIPER_RUNTIME_KERNELS_CLIPFACTOR_H

#include <limits>

#if defined(__CUDACC__)
#define PIPER_CLIP_FN __host__ __device__ inline
#else
#define PIPER_CLIP_FN inline
#endif

namespace piper::runtime {

/// The clip factor for the world's gradient `norm` and the plan's `maxNorm`
/// (0: no clipping): float(maxNorm / (norm + 1e-6)) where the norm exceeds
/// it, 1 where not, and NaN where the norm is not finite (a diverged step:
/// nothing is updated).
PIPER_CLIP_FN float clipFactorOf(double norm, double maxNorm) {
  if (!(norm - norm == 0.0)) {
#if defined(__CUDA_ARCH__)
    return __int_as_float(0x7FC00000);
#else
    return std::numeric_limits<float>::quiet_NaN();
#endif
  }
  if (maxNorm <= 0 || norm <= maxNorm)
    return 1.0f;
  return static_cast<float>(maxNorm / (norm + 1e-6));
}

} // namespace piper::runtime

#undef PIPER_CLIP_FN

#endif // PIPER_RUNTIME_KERNELS_CLIPFACTOR_H
