// Rotary embedding frequencies, shared by the CPU kernels and the GPU
// kernels (runtime/hal/gpu, host and device code): theta^(-2i/hd), and Llama
// 3.1's rescaling of them (#piper.rope_llama3, transformers' rope_type
// "llama3"). Computed in double, as both backends' rotary tables are.
#ifndef PIPER_RUNTIME_KERNELS_ROPE_H
#define PIPER_RUNTIME_KERNELS_ROPE_H

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PIPER_ROPE_FN __host__ __device__ inline
#else
#define PIPER_ROPE_FN inline
#endif

namespace piper::runtime {

/// Llama 3.1's frequency scaling; factor 0: none.
struct RopeScaling {
  double factor = 0;
  double lowFreqFactor = 0;
  double highFreqFactor = 0;
  double originalMaxPosition = 0;
};

/// The frequency of rotary pair `i` (0 <= i < headDim / 2): theta^(-2i/hd),
/// rescaled by `s`: with wavelength w = 2 pi / f and L the original
/// context, f when w < L / high_freq_factor, f / factor when
/// w > L / low_freq_factor, else (1 - t) f / factor + t f with
/// t = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor).
PIPER_ROPE_FN double ropeFrequency(double theta, int64_t headDim, int64_t i,
                                   const RopeScaling &s) {
  double freq = pow(theta, -2.0 * double(i) / double(headDim));
  if (s.factor == 0)
    return freq;
  const double wavelen = 2.0 * 3.14159265358979323846 / freq;
  if (wavelen < s.originalMaxPosition / s.highFreqFactor)
    return freq;
  if (wavelen > s.originalMaxPosition / s.lowFreqFactor)
    return freq / s.factor;
  const double t = (s.originalMaxPosition / wavelen - s.lowFreqFactor) /
                   (s.highFreqFactor - s.lowFreqFactor);
  return (1.0 - t) * freq / s.factor + t * freq;
}

} // namespace piper::runtime

#endif // PIPER_RUNTIME_KERNELS_ROPE_H
