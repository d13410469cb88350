// A readable, line-oriented text form of a plan, for people and FileCheck.
#ifndef PIPER_PROTO_PLANDUMP_H
#define PIPER_PROTO_PLANDUMP_H

#include <string>

#include "proto/plan.pb.h"

namespace piper::plan {

/// Renders `plan` as text: a header line (class, ranks, world, schema), the
/// training configuration, device groups, parameters, segments with their
/// kernels, step buffers and, per stream, the ordered instructions. Every
/// entity is printed with its index (`g0`, `p3`, `s1`, `b7`, `e2`, `v4`) so a
/// test can capture and follow references. With `withKernels` false the
/// bodies of segments are left out (only their signatures are printed).
std::string dumpPlan(const Plan &plan, bool withKernels = true);

/// Renders `manifest` as text: world size, strategy, model, and one line per
/// device class.
std::string dumpManifest(const Manifest &manifest);

} // namespace piper::plan

#endif // PIPER_PROTO_PLANDUMP_H
