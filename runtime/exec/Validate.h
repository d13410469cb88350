// Static checks of a plan before it runs, so that a bad plan is an error
// naming the instruction instead of a crash, a race or a hang.
#ifndef PIPER_RUNTIME_EXEC_VALIDATE_H
#define PIPER_RUNTIME_EXEC_VALIDATE_H

#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "support/Status.h"

namespace piper::runtime {

/// Checks one plan on its own: schema version, ranks and groups, every index
/// (segments, buffers, values, params, groups, events) and operand, types of
/// buffers bound to segment arguments and results, single writers of
/// buffers, and, by simulating the streams, that events cannot deadlock and
/// that every cross-stream use of a buffer or of parameter state is ordered
/// by events. Every kernel must match its entry of the kernel table
/// (proto/KernelIds.h): a known op, its operand counts, its required
/// attributes. Messages name the stream, instruction index and label, or the
/// segment and kernel.
Status validatePlan(const plan::Plan &plan);

/// Checks a whole compiled strategy: that the manifest's classes cover ranks
/// 0..world_size-1 exactly once and agree with their plans, and that every
/// SEND has a RECV on its peer with the same stream name, tag and size, and
/// every all-reduce group issues the same sequence of all-reduces on all its
/// members. `plans[i]` is the plan of `manifest.classes(i)`; each is assumed
/// to have passed validatePlan.
Status validateStrategy(const plan::Manifest &manifest,
                        const std::vector<plan::Plan> &plans);

/// "stream 'S', instruction I (LABEL)", the context of every per-instruction
/// diagnostic; the label falls back to the instruction kind.
std::string instructionContext(const plan::Plan &plan, int stream,
                               int instruction);

/// Bytes of a tensor of `type` (plan::tensorBytes: BF16 2 bytes an element,
/// F32 and I32 4), or -1 when a dimension is negative or the size is over
/// 64 TiB, the most the runtime accepts.
int64_t tensorBytes(const plan::TensorType &type);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_EXEC_VALIDATE_H
