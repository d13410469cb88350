// Schedules: the piper-schedule pass runs a builder of the schedule
// registry and applies the `order` directives it emits.
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

namespace mlir::piper {
#define GEN_PASS_DEF_PIPERSCHEDULE
#include "compiler/transforms/Passes.h.inc"
} // namespace mlir::piper

using namespace mlir;
using namespace mlir::piper;

/// The pipeline shape a schedule sees: P device groups of `perDevice`
/// stages each, in the schedule's layout. Stages that are placed must sit
/// on their groups as the layout says; unplaced ones are taken to.
static FailureOr<std::pair<int64_t, int64_t>>
pipelineShape(ProgramOp program, const ScheduleBuilder &schedule,
              int64_t stages, StringRef what) {
  // The device group of each stage: that of its first microbatch (of its
  // last one in `lastGroupOf`).
  int64_t microbatches = program.getNumMicrobatches();
  SmallVector<DeviceGroupAttr> groupOf(stages), lastGroupOf(stages);
  for (TaskOp t : program.getBody().front().getOps<TaskOp>()) {
    auto pp = t.getTag().getPp();
    if (!pp || !t.getTag().isPass(PassKind::F))
      continue;
    if (t.getTag().getMb() == 0)
      groupOf[*pp] = t.getDevicesAttr();
    if (t.getTag().getMb() == microbatches - 1)
      lastGroupOf[*pp] = t.getDevicesAttr();
  }
  bool placed = llvm::all_of(groupOf, [](DeviceGroupAttr g) { return g; });
  auto fail = [&]() {
    return program.emitOpError(what) << ": schedule '" << schedule.name << "' ";
  };
  if (!placed) {
    int64_t perDevice = defaultStagesPerDevice(schedule);
    if (stages % perDevice != 0)
      return fail() << "needs an even number of stages for its V layout "
                       "(device group d holds stages d and 2P-1-d), got "
                    << stages;
    return std::make_pair(stages / perDevice, perDevice);
  }
  llvm::SetVector<Attribute> groups;
  for (DeviceGroupAttr g : groupOf)
    groups.insert(g);
  int64_t devices = groups.size();
  if (schedule.layout == StageLayout::V && stages != 2 * devices)
    return fail() << "needs the V layout: two stages per device group, "
                     "stages d and 2P-1-d together, "
                  << (stages % 2 ? "and an even number of stages; got "
                                 : "got ")
                  << stages << " stages on " << devices << " device groups";
  if (stages % devices != 0)
    return fail() << "cannot spread " << stages << " stages evenly over "
                  << devices << " device groups";
  if (schedule.layout == StageLayout::Bidirectional) {
    for (int64_t st = 0; st < stages; ++st)
      if (lastGroupOf[st] != groupOf[stages - 1 - st])
        return fail() << "expects the second half of stage " << st
                      << "'s microbatches on the device group of stage "
                      << stages - 1 - st << " ("
                      << formatDevices(groupOf[stages - 1 - st].getMembers())
                      << "), but its last microbatch runs on "
                      << formatDevices(lastGroupOf[st].getMembers());
  }
  // Group d of the layout is the group of its first stage (stage d).
  for (int64_t st = 0; st < stages; ++st) {
    int64_t d = deviceOfStage(schedule.layout, st, devices);
    if (groupOf[st] != groupOf[d])
      return fail() << "expects stage " << st << " on the device group of "
                    << "stage " << d << " ("
                    << formatDevices(groupOf[d].getMembers())
                    << ") in its layout, but it runs on "
                    << formatDevices(groupOf[st].getMembers());
  }
  return std::make_pair(devices, stages / devices);
}

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
  FailureOr<std::pair<int64_t, int64_t>> shape =
      pipelineShape(*program, schedule, stages, what);
  if (failed(shape))
    return failure();
  auto [devices, perDevice] = *shape;
  int64_t microbatches = program->getNumMicrobatches();
  if (std::string err = schedule.check(devices, perDevice, microbatches);
      !err.empty())
    return program->emitOpError(what)
           << ": schedule '" << schedule.name << "' " << err;
  for (Directive &d : buildSchedule(schedule, devices, perDevice, microbatches))
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
