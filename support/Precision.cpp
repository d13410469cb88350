// bfloat16 rounding of whole buffers.
#include "support/Precision.h"

namespace piper {

void roundToBf16(float *data, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    data[i] = roundToBf16(data[i]);
}

} // namespace piper
