// The bytes of plan tensors, as the runtime stores them: shared by the
// compiler (lowering and its reports), the memory plan, the simulator and
// the runtime's validator and executor, so that none of them counts a
// tensor differently.
//
// Plans carry F32 and I32 tensor types only. In bf16 plans
// (training.compute_dtype BF16) the runtime stores float32 step buffers of
// rank >= 1 packed, 2 bytes an element, and sends them packed too
// (docs/memory-plan.md); parameter state, segment scratch (float32
// containers), scalars and i32 buffers stay 4 bytes an element.
#ifndef PIPER_PROTO_PLANTENSORS_H
#define PIPER_PROTO_PLANTENSORS_H

#include <cstdint>
#include <limits>

#include "proto/plan.pb.h"

namespace piper::plan {

/// Bytes of one element of `dtype`: 4 for F32 and I32, 2 for BF16 (the
/// packed storage of bf16 plans).
int64_t dtypeBytes(DType dtype);

/// Bytes of a tensor of `type` (its dtype's element size times its
/// elements), or -1 when a dimension is negative or the size overflows or
/// is more than `limit`.
int64_t tensorBytes(const TensorType &type,
                    int64_t limit = std::numeric_limits<int64_t>::max());

/// Whether a step buffer of `type` is stored packed as bf16: in bf16 plans
/// (`bf16`), float32 tensors of rank >= 1 (a scalar loss stays float32).
bool packedBf16(const TensorType &type, bool bf16);

/// The type a step buffer of `type` is stored and sent as in `plan`: BF16
/// when packedBf16, else `type`.
TensorType storedType(const Plan &plan, const TensorType &type);

} // namespace piper::plan

#endif // PIPER_PROTO_PLANTENSORS_H
