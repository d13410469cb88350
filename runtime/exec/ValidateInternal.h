// Internal to runtime/exec: what the plan validator's files share: naming
// helpers for diagnostics, the structural checks of one segment or
// instruction, and the ordering facts from simulating the streams.
#ifndef PIPER_RUNTIME_EXEC_VALIDATEINTERNAL_H
#define PIPER_RUNTIME_EXEC_VALIDATEINTERNAL_H

#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "support/Status.h"

namespace piper::runtime::validate {

/// "f32[2,3]".
std::string shapeString(const plan::TensorType &type);
bool sameType(const plan::TensorType &a, const plan::TensorType &b);
/// Checks the dtype (F32 or I32) and the shape of a declared tensor.
Status checkType(const plan::TensorType &type, const std::string &what);
/// "buffer 'NAME' (id I)", or "buffer I" without a name.
std::string bufferName(const plan::Plan &plan, int id);
std::string paramName(const plan::Plan &plan, int index);
/// "value", "gradient", ... for an Operand::Kind of parameter state.
const char *stateName(int kind);
std::string ranksString(const std::vector<int> &ranks);
/// Checks that `ranks` is a non-empty set of distinct world ranks.
Status checkRankList(const google::protobuf::RepeatedField<int32_t> &ranks,
                     int worldSize, const std::string &what);

/// Indices, operands and dataflow inside segment `index`; every kernel
/// against the kernel table (proto/KernelIds.h).
Status checkSegment(const plan::Plan &plan, int index);
/// The compiler's vocabulary padding in segment `seg` (`where` names it):
/// every kernel touching a value some kernel writes with padded rows
/// (valid_cols) takes it at a padded operand with the same valid_cols, and
/// no segment result is one (docs/kernels.md, "Padded vocabulary").
Status checkPaddedValues(const plan::Segment &seg, const std::string &where);
/// The checks of one instruction that need nothing but the plan's tables.
Status checkInstruction(const plan::Plan &plan, const plan::Instruction &inst);

/// Single writers, recorded events, and the happens-before order of every
/// cross-stream use of a buffer or of parameter state (by simulating the
/// streams with events as the only cross-stream edges); also finds event
/// deadlocks.
Status checkStreamOrdering(const plan::Plan &plan);

} // namespace piper::runtime::validate

#endif // PIPER_RUNTIME_EXEC_VALIDATEINTERNAL_H
