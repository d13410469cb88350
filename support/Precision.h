// bfloat16 conversion and rounding for mixed precision: the CPU backend, the
// Gloo collectives (bf16 sums in fp32, rounded once) and their tests.
#ifndef PIPER_SUPPORT_PRECISION_H
#define PIPER_SUPPORT_PRECISION_H

#include <cstdint>
#include <cstring>

namespace piper {

/// The bfloat16 bits of `x`, rounded to nearest, ties to even (as
/// torch.Tensor.to(torch.bfloat16) and CUDA's __float2bfloat16_rn); NaN stays
/// a quiet NaN.
inline uint16_t floatToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu))
    return static_cast<uint16_t>((bits >> 16) | 0x0040u); // quiet NaN
  uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

/// The float value of bfloat16 bits.
inline float bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

/// `x` rounded to the nearest bfloat16 value.
inline float roundToBf16(float x) { return bf16ToFloat(floatToBf16(x)); }

/// Rounds `n` floats in place to bfloat16 precision.
void roundToBf16(float *data, int64_t n);
/// dst[i] = floatToBf16(src[i]) for `n` floats.
void packBf16(uint16_t *dst, const float *src, int64_t n);
/// dst[i] = bf16ToFloat(src[i]) for `n` values.
void unpackBf16(float *dst, const uint16_t *src, int64_t n);

} // namespace piper

#endif // PIPER_SUPPORT_PRECISION_H
