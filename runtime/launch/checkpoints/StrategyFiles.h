// Reading a compiled strategy folder for a run: the manifest, the plans and
// the files they need (--data), checked before any rank starts.
#ifndef PIPER_RUNTIME_LAUNCH_CHECKPOINTS_STRATEGYFILES_H
#define PIPER_RUNTIME_LAUNCH_CHECKPOINTS_STRATEGYFILES_H

#include <cstdint>
#include <memory>
#include <vector>

#include "proto/plan.pb.h"
#include "runtime/exec/Data.h"
#include "runtime/launch/options/RunOptions.h"
#include "support/Status.h"

namespace piper::runtime {

/// Reads the manifest of options.outDir and checks it against the command
/// line (--backend).
Status loadManifest(const RunOptions &options, plan::Manifest &manifest);

/// Reads the plan file of manifest class `index` and checks that the
/// manifest's `training` agrees with the plan's on every field the plan sets
/// (an error names the field and both values).
Status loadPlan(const RunOptions &options, const plan::Manifest &manifest,
                int index, plan::Plan &plan);

/// Reads and validates every plan of the manifest, in class order (loadPlan),
/// and checks that every `training` field the manifest sets is set by a
/// plan.
Status loadPlans(const RunOptions &options, const plan::Manifest &manifest,
                 std::vector<plan::Plan> &plans);

/// Whether `plan` has a LOAD_BATCH instruction (needs a data source).
bool loadsBatches(const plan::Plan &plan);

/// Opens --data for a plan trained with `training` (null when there is no
/// --data): maps the file and checks its tokens against the vocabulary and
/// sequence length.
Status openData(const RunOptions &options, const plan::TrainingConfig &training,
                uint64_t seed, std::unique_ptr<TokenFileData> &out);

/// Checks every plan, the strategy as a whole, and the files of --data,
/// --load and the outputs (checkOutputTargets) before any rank starts, so
/// that a bad compile or a bad file is one clear message, not N, and before
/// any step, not after the last.
Status checkStrategy(const RunOptions &options, const plan::Manifest &manifest);

/// Checks that every file piper-run will write (--save, --save-grads,
/// --metrics, --save-params, --log-dir, --checkpoint-dir) can be written: see
/// checkWritableTarget.
Status checkOutputTargets(const RunOptions &options);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_CHECKPOINTS_STRATEGYFILES_H
