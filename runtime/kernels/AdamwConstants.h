// The per-step constants of the AdamW update, shared by the CPU kernel and
// the GPU kernels' math (plain data, no dependencies).
#ifndef PIPER_RUNTIME_KERNELS_ADAMWCONSTANTS_H
#define PIPER_RUNTIME_KERNELS_ADAMWCONSTANTS_H

namespace piper::runtime {

/// lr (already scaled by the schedule), decay = lr * weight_decay, the betas,
/// eps and the bias corrections 1 - beta^t.
/// An adamw call's attributes.
struct AdamwHyper {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0;
};

struct AdamwConstants {
  double lr, decay, beta1, beta2, eps, correction1, correction2;
};

} // namespace piper::runtime

#endif // PIPER_RUNTIME_KERNELS_ADAMWCONSTANTS_H
