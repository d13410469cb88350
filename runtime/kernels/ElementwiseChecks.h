// Operand and attribute checks of the elementwise and optimizer kernels
// (gelu, swiglu, add, accumulate, zero, adamw), shared by the CPU kernels and
// the GPU kernels (runtime/hal/gpu): both backends accept and reject
// exactly the same calls, with the same messages.
#ifndef PIPER_RUNTIME_KERNELS_ELEMENTWISECHECKS_H
#define PIPER_RUNTIME_KERNELS_ELEMENTWISECHECKS_H

#include <cstdint>

#include "runtime/kernels/AdamwConstants.h"
#include "runtime/kernels/KernelUtil.h"

namespace piper::runtime::detail {

// The outputs of gelu, gelu_grad, swiglu and swiglu_grad may in mixed
// precision be packed bf16 (expectPackableOutput: an activation the
// executor stores packed because only GEMMs read it,
// hal::Device::writesPackedOutput), as may the dy of gelu_grad and
// swiglu_grad (linear_grad_input's packed dx: readsPackedInput).

/// gelu: f32 x -> y of x's shape.
Status checkGelu(const KernelArgs &a);
/// gelu_grad: (x, dy) -> dx, all of x's shape.
Status checkGeluGrad(const KernelArgs &a);
/// swiglu: gate_up [rows, 2 width] -> y [rows, width].
Status checkSwiglu(const KernelArgs &a, int64_t &rows, int64_t &width);
/// swiglu_grad: (gate_up, dy) -> dgate_up.
Status checkSwigluGrad(const KernelArgs &a, int64_t &rows, int64_t &width);
/// add: (a, b) -> y, one shape.
Status checkAdd(const KernelArgs &a);
/// accumulate: g -> acc (in place), one shape.
Status checkAccumulate(const KernelArgs &a);
/// zero: -> t (f32 or i32), in place.
Status checkZero(const KernelArgs &a);
/// adamw: grad -> (param, m, v) in place; its attributes, and the
/// context's step (at least 1) and lr scale (finite, not negative).
Status checkAdamw(const KernelArgs &a, AdamwHyper &h);
/// The constants of step `step` of a call with attributes `h`, its lr
/// scaled by `lrScale` (scheduleScale): computed on the host in double, so
/// that every backend's update reads the same bits.
AdamwConstants adamwConstants(const AdamwHyper &h, int64_t step,
                              double lrScale);

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_ELEMENTWISECHECKS_H
