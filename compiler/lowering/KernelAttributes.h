// The attributes of the plan kernel a compute op lowers to (docs/kernels.md),
// for the lowering to plans (LowerToPlan.cpp).
#ifndef PIPER_COMPILER_LOWERING_KERNELATTRIBUTES_H
#define PIPER_COMPILER_LOWERING_KERNELATTRIBUTES_H

#include <cstdint>

#include "proto/plan.pb.h"

#include "mlir/IR/Operation.h"

namespace mlir::piper {

/// Sets on `k` the attributes of compute op `op`'s kernel: its integer,
/// float and unit attributes by name, Llama 3.1's rope scaling as the
/// kernels' rope_* attributes, the norms' eps (a default the op does not
/// store), the embedding gradient's vocabulary, the loss terms' `scale`
/// (from `lossScale`, the seed 1 / (microbatches * replicas), and `tp`, the
/// tensor-parallel degree, whose members each compute the same loss) and the
/// routers' norm_topk.
void setKernelAttributes(Operation &op, double lossScale, int64_t tp,
                         ::piper::plan::Kernel &k);

} // namespace mlir::piper

#endif // PIPER_COMPILER_LOWERING_KERNELATTRIBUTES_H
