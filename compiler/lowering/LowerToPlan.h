// Lowering of ordered device programs to plan.proto: one Plan per device
// class plus the manifest.
#ifndef PIPER_COMPILER_LOWERING_LOWERTOPLAN_H
#define PIPER_COMPILER_LOWERING_LOWERTOPLAN_H

#include <string>
#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "proto/plan.pb.h"

namespace mlir::piper {

namespace plan = ::piper::plan;

/// The lowered strategy: a manifest and one plan per device class, in
/// manifest order.
struct LoweredPlans {
  plan::Manifest manifest;
  std::vector<plan::Plan> plans;
};

/// Bytes of a plan tensor of `type`, 0 for an invalid shape: the runtime's
/// count (::piper::plan::tensorBytes). The lowering writes F32 and I32 types
/// only, so this is 4 bytes an element, also in bf16 plans: right for
/// parameters (fp32 state) and segment values (fp32 scratch), but a step
/// buffer of a bf16 plan is stored and sent packed, 2 bytes an element; pass
/// ::piper::plan::storedType(plan, type) to count that.
int64_t planTensorBytes(const plan::TensorType &type);

/// Lowers every piper.device_program of `module` (after piper-order-streams)
/// to plans. Emits diagnostics and fails on IR it cannot lower, or (with
/// `checkProgress`) on plans that cannot finish a step together; a caller
/// that simulates the plans itself (piperc search) meets that error there.
/// With `fuseKernels` (piperc's default; --no-fused-epilogues turns it off)
/// some ops' kernels merge into another's (SegmentFusions.h): a weight
/// gradient that only goes to its parameter's accumulator is added to it by
/// its linear_grad_weight(_bias) kernel (`accumulate`) instead of by an
/// `accumulate` kernel, and gelu and gelu_grad run with the GEMM before them
/// (`linear_gelu`, `linear_grad_input_gelu`). With `padVocab` > 1 (piperc's
/// default 64; --pad-vocab), a classifier's logits and their gradient are
/// stored with rows padded to a multiple of it (VocabPadding.h).
FailureOr<LoweredPlans>
lowerToPlans(ModuleOp module, const std::string &modelName,
             const std::string &strategySummary, bool checkProgress = true,
             bool fuseKernels = false, int64_t padVocab = 0);

} // namespace mlir::piper

#endif // PIPER_COMPILER_LOWERING_LOWERTOPLAN_H
