// The kernel ids: every op a plan's Kernel.op may name, with its operand
// counts and the attributes it requires. One table, shared by the compiler's
// lowering (which rejects an op with no kernel here), the plan validator
// (which checks every kernel of a plan against it) and every runtime backend
// (whose registry must implement exactly these kernels; a missing one is an
// error naming it when a plan loads). Semantics: docs/kernels.md.
//
// Depends on protobuf (plan.proto) only: no MLIR, no runtime.
#ifndef PIPER_PROTO_KERNELIDS_H
#define PIPER_PROTO_KERNELIDS_H

#include <string>
#include <vector>

#include "proto/plan.pb.h"

namespace piper::plan {

/// What a kernel takes: `minInputs..maxInputs` input operands (equal unless
/// some are optional, e.g. linear's bias), exactly `outputs` outputs, and
/// attributes that must be present (numbers; others have defaults).
struct KernelSignature {
  const char *name;
  int minInputs;
  int maxInputs;
  int outputs;
  std::vector<std::string> requiredAttrs;
};

/// Every kernel, in a fixed order: forward, backward, then state and
/// optimizer kernels.
const std::vector<KernelSignature> &kernelSignatures();

/// The entry of op `name`, or null when no kernel has that name.
const KernelSignature *findKernelSignature(const std::string &name);

/// The compiler's vocabulary padding (`valid_cols`, docs/kernels.md,
/// "Padded vocabulary"): the positions of a kernel's operands of the
/// vocabulary dimension, which it may take stored with padded rows.
struct PaddedOperands {
  std::vector<int> inputs, outputs;
};

/// The operands op `name` may take padded, or null when it has no padded
/// form.
const PaddedOperands *findPaddedOperands(const std::string &name);

/// Checks `kernel` against the table: its op is a kernel id, it has an
/// accepted number of inputs and outputs, and every required attribute is
/// present and numeric. Returns "" or the problem, e.g. "unknown kernel
/// 'conv2d'", "kernel 'linear' takes 2 or 3 inputs, got 1", "kernel
/// 'attention' requires attribute 'heads'".
std::string checkKernelSignature(const Kernel &kernel);

/// Checks a backend's kernel registry against the table: "" when
/// `implemented` names every kernel of the table and no other; otherwise
/// "backend 'B': no kernel 'x', 'y'; kernel 'z' is not in the kernel table".
std::string checkBackendKernels(const std::string &backend,
                                const std::vector<std::string> &implemented);

} // namespace piper::plan

#endif // PIPER_PROTO_KERNELIDS_H
