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

/// Bytes of a plan tensor (f32 and i32 elements are 4 bytes).
int64_t planTensorBytes(const plan::TensorType &type);

/// Lowers every piper.device_program of `module` (after piper-order-streams)
/// to plans. Emits diagnostics and fails on IR it cannot lower.
FailureOr<LoweredPlans> lowerToPlans(ModuleOp module,
                                     const std::string &modelName,
                                     const std::string &strategySummary);

} // namespace mlir::piper

#endif // PIPER_COMPILER_LOWERING_LOWERTOPLAN_H
