// Plan validation, the entry point: header, groups, params, buffers,
// segments and instructions (ValidateChecks.cpp), then stream ordering
// (ValidateOrdering.cpp). Strategies: ValidateStrategy.cpp.
#include "runtime/exec/Validate.h"

#include <cmath>
#include <set>

#include "proto/PlanFile.h"
#include "proto/PlanShards.h"
#include "proto/PlanTensors.h"
#include "proto/analysis/MemoryPlan.h"
#include "runtime/exec/ValidateInternal.h"

namespace piper::runtime {

using plan::Instruction;
using namespace validate;

int64_t tensorBytes(const plan::TensorType &type) {
  return plan::tensorBytes(type, int64_t(1) << 46);
}

std::string instructionContext(const plan::Plan &plan, int stream,
                               int instruction) {
  const plan::Stream &s = plan.streams(stream);
  std::string label;
  if (instruction >= 0 && instruction < s.instructions_size()) {
    const Instruction &inst = s.instructions(instruction);
    label = inst.label();
    if (label.empty())
      label = Instruction::Kind_IsValid(inst.kind())
                  ? Instruction::Kind_Name(inst.kind())
                  : "kind " + std::to_string(inst.kind());
  }
  return "stream '" + s.name() + "', instruction " +
         std::to_string(instruction) + " (" + label + ")";
}

Status validatePlan(const plan::Plan &plan) {
  if (plan.schema_version() != plan::kPlanSchemaVersion)
    return Status::error("plan schema version " +
                         std::to_string(plan.schema_version()) +
                         " is not supported (this runtime reads version " +
                         std::to_string(plan::kPlanSchemaVersion) + ")");
  if (plan.world_size() < 1)
    return Status::error("world_size " + std::to_string(plan.world_size()) +
                         " must be at least 1");
  PIPER_RETURN_IF_ERROR(
      checkRankList(plan.ranks(), plan.world_size(), "the plan"));
  if (plan.num_events() < 0)
    return Status::error("num_events is negative");

  for (int g = 0; g < plan.groups_size(); ++g) {
    const plan::DeviceGroup &group = plan.groups(g);
    std::string what = "group " + std::to_string(g);
    if (group.id() != g)
      return Status::error(what + " has id " + std::to_string(group.id()) +
                           " (groups are referenced by position; id must "
                           "equal the position)");
    PIPER_RETURN_IF_ERROR(
        checkRankList(group.ranks(), plan.world_size(), what));
  }

  std::set<std::string> paramNames;
  for (int p = 0; p < plan.params_size(); ++p) {
    const plan::Parameter &param = plan.params(p);
    std::string what =
        "param " + std::to_string(p) + " ('" + param.name() + "')";
    if (param.name().empty())
      return Status::error(what + " has no name");
    // Names key the initializer and name the --save-params files.
    if (param.name().find('/') != std::string::npos ||
        param.name().find('\0') != std::string::npos || param.name()[0] == '.')
      return Status::error(what + " is not usable as a file name (no '/', "
                                  "no leading '.')");
    if (!paramNames.insert(param.name()).second)
      return Status::error(what + ": the name is used twice");
    PIPER_RETURN_IF_ERROR(checkType(param.type(), what));
    if (param.type().dtype() != plan::F32)
      return Status::error(what + " must be F32");
    if (!plan::Initializer::Kind_IsValid(param.init().kind()))
      return Status::error(what + " has unknown initializer kind " +
                           std::to_string(param.init().kind()));
    if (!std::isfinite(param.init().scale()))
      return Status::error(what + " has a non-finite initializer scale");
  }

  if (std::string problem = plan::checkSharding(plan); !problem.empty())
    return Status::error(problem);

  for (int b = 0; b < plan.buffers_size(); ++b) {
    const plan::Buffer &buf = plan.buffers(b);
    if (buf.id() != b)
      return Status::error(bufferName(plan, b) + " is at position " +
                           std::to_string(b) + " but has id " +
                           std::to_string(buf.id()) +
                           " (buffers are referenced by position; id must "
                           "equal the position)");
    PIPER_RETURN_IF_ERROR(checkType(buf.type(), bufferName(plan, b)));
  }

  for (int s = 0; s < plan.segments_size(); ++s)
    PIPER_RETURN_IF_ERROR(checkSegment(plan, s));

  std::set<std::string> streamNames;
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    if (stream.name().empty())
      return Status::error("stream " + std::to_string(s) + " has no name");
    if (!streamNames.insert(stream.name()).second)
      return Status::error("stream name '" + stream.name() + "' is used twice");
    if (!plan::Stream::Kind_IsValid(stream.kind()))
      return Status::error("stream '" + stream.name() + "' has unknown kind " +
                           std::to_string(stream.kind()));
    for (int i = 0; i < stream.instructions_size(); ++i) {
      const plan::Instruction &inst = stream.instructions(i);
      if (stream.kind() == plan::Stream::COMM &&
          inst.kind() == plan::Instruction::CALL)
        return Status::error("it runs kernels, but '" + stream.name() +
                             "' is a communication stream")
            .withContext(instructionContext(plan, s, i));
      PIPER_RETURN_IF_ERROR(checkInstruction(plan, inst).withContext(
          instructionContext(plan, s, i)));
    }
  }

  PIPER_RETURN_IF_ERROR(checkStreamOrdering(plan));
  // The memory plan is checked, not trusted: a layout in which two tensors
  // that may be live together share bytes would corrupt numerics silently.
  std::string arenaError;
  if (!plan::checkArena(plan, arenaError))
    return Status::error(arenaError);
  return Status::ok();
}

} // namespace piper::runtime
