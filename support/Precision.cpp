// bfloat16 rounding, packing and unpacking of whole buffers.
#include "support/Precision.h"

namespace piper {

void roundToBf16(float *data, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    data[i] = roundToBf16(data[i]);
}

void packBf16(uint16_t *dst, const float *src, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = floatToBf16(src[i]);
}

void unpackBf16(float *dst, const uint16_t *src, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = bf16ToFloat(src[i]);
}

} // namespace piper
