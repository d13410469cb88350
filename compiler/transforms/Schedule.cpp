// Schedules: the piper-schedule pass runs a builder of the schedule
// registry and applies the `order` directives it emits.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERSCHEDULE
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

LogicalResult mlir::piper::applySchedule(ModuleOp module,
                                         const ScheduleBuilder &schedule,
                                         StringRef what) {
  FailureOr<ProgramOp> program = getProgram(module);
  if (failed(program))
    return failure();
  int64_t stages = 0;
  for (TaskOp t : program->getBody().front().getOps<TaskOp>()) {
    if (auto pp = t.getTag().getPp())
      stages = std::max(stages, *pp + 1);
    if (!t.getTag().isPass(PassKind::U) && !t.getTag().getMb())
      return t.emitOpError(what)
             << ": " << describeNode(t)
             << " has no MB tag: schedules order microbatches, run "
                "piper-split first";
  }
  int64_t microbatches = program->getNumMicrobatches();
  if (std::string err = schedule.check(stages, microbatches); !err.empty())
    return program->emitOpError(what)
           << ": schedule '" << schedule.name << "' " << err;
  for (Directive &d : buildSchedule(schedule, stages, microbatches))
    if (failed(applyDirective(module, d, std::nullopt)))
      return failure();
  return success();
}

namespace {
struct SchedulePass : mlir::piper::impl::PiperScheduleBase<SchedulePass> {
  using PiperScheduleBase::PiperScheduleBase;
  void runOnOperation() override {
    const ScheduleBuilder *s = findSchedule(schedule);
    if (!s) {
      getOperation().emitError("unknown schedule '")
          << schedule << "' (expected " << scheduleNames() << ")";
      return signalPassFailure();
    }
    if (failed(applySchedule(getOperation(), *s, "piper-schedule")))
      return signalPassFailure();
  }
};
} // namespace
