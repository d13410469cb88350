#include "proto/PlanTensors.h"

namespace piper::plan {

int64_t dtypeBytes(DType dtype) { return dtype == BF16 ? 2 : 4; }

int64_t tensorBytes(const TensorType &type, int64_t limit) {
  int64_t n = dtypeBytes(type.dtype());
  for (int64_t d : type.shape())
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > limit)
      return -1;
  return n;
}

bool packedBf16(const TensorType &type, bool bf16) {
  return bf16 && type.dtype() == F32 && type.shape_size() > 0;
}

TensorType storedType(const Plan &plan, const TensorType &type) {
  TensorType stored = type;
  if (packedBf16(type, plan.training().compute_dtype() == BF16))
    stored.set_dtype(BF16);
  return stored;
}

} // namespace piper::plan
