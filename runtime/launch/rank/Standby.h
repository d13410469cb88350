// Hot spares (--standby), the ranks' side: a spare loads the strategy and
// parks until the local launcher names the rank it replaces; every rank of
// a run with spares keeps its state at its last two step boundaries and
// hands it off when a peer fails; a rank of the next generation loads its
// device class's state from where the launcher points it
// (docs/operations.md, "Hot spares").
#ifndef PIPER_RUNTIME_LAUNCH_RANK_STANDBY_H
#define PIPER_RUNTIME_LAUNCH_RANK_STANDBY_H

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/exec/Executor.h"
#include "runtime/formats/Safetensors.h"
#include "runtime/launch/options/RunOptions.h"
#include "runtime/launch/rendezvous/LaunchEnv.h"
#include "support/Status.h"

namespace piper::runtime {

/// A rank's parameters and AdamW moments at its last two step boundaries
/// (host copies, as the rank holds them: a tensor-parallel member's
/// slices in their local shapes), so that whatever step its peers stopped at,
/// the state of the last step every survivor finished is at hand. Thread-safe:
/// the main thread takes them, the watchdog's thread writes them.
class StepSnapshots {
public:
  /// Copies `exec`'s state after `step` (the step boundary) over the older
  /// of the two held (dropped when a device copy fails).
  Status take(const Executor &exec, int64_t step);
  /// Writes every held step to `dir`/step-<S>/ as checkpoint files, the
  /// marker last.
  Status write(const std::string &dir) const;

private:
  struct Slot {
    int64_t step = -1;
    /// Per parameter: PARAM, ADAM_M, ADAM_V.
    std::vector<std::vector<float>> tensors;
  };
  mutable std::mutex mu;
  std::vector<ParamSpec> specs;
  /// The executor's run id at the last take, recorded in the files.
  std::string runId;
  Slot slots[2];
  int newest = 1;
};

/// Whether this process was started as a spare (PIPER_STANDBY).
bool isStandby();

/// A spare's main: loads and checks the manifest and every plan, parks
/// until the launcher promotes it (then runs as that rank, runRank) or
/// releases it at the end of the run (exit 0).
int runStandby(const RunOptions &options);

/// The state a recovered rank starts from: its class's files in the
/// launcher's recovery folder.
struct RecoveredState {
  int64_t step = 0;
  std::unique_ptr<SafetensorsReader> model, optimizer;
  /// The run id the files record ("" if none).
  std::string runId;
};

/// Opens `dir`/recoveryStateName(cls, member)/ (kRecoveryDirVar) and
/// checks that both files hold the same step, match the CRC-32s they record
/// and hold finite values.
Status openRecoveredState(const std::string &dir, int cls, int64_t member,
                          RecoveredState &out);

/// Whether a rank of `plan` keeps step snapshots to hand off: its state is
/// whole or tensor-parallel slices, which the other replicas of its
/// tensor-parallel member hold too; not ZeRO ranges or expert blocks.
bool handsOffState(const plan::Plan &plan);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_RANK_STANDBY_H
