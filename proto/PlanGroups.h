// The device group a rank runs a collective instruction with: its
// `group`, or the one of its `subgroups` that contains the rank; and which
// instruction kinds communicate. Shared by the validator, the executor, the
// simulator, the timeline pictures and the watchdog.
#ifndef PIPER_PROTO_PLANGROUPS_H
#define PIPER_PROTO_PLANGROUPS_H

#include <string>

#include "proto/plan.pb.h"

namespace piper::plan {

/// Checks `inst.group()` and `inst.subgroups()` against `plan.groups()`:
/// ids in range; subgroups disjoint, of one size, each in increasing rank
/// order, together exactly the ranks of `group`. Returns "" or the problem.
std::string checkCollectiveGroups(const Plan &plan, const Instruction &inst);

/// The group `rank` runs `inst` with: the subgroup containing it, or
/// `group` when there are no subgroups; null when ids are out of range or no
/// subgroup contains `rank` (checkCollectiveGroups reports why).
const DeviceGroup *memberGroup(const Plan &plan, const Instruction &inst,
                               int rank);

/// Whether instructions of `kind` are collectives over a device group (their
/// `group`, or the member's subgroup: memberGroup): ALL_REDUCE,
/// REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER_GRADS and
/// ALL_GATHER_PARAMS.
bool isGroupCollective(Instruction::Kind kind);

/// Whether instructions of `kind` are collectives: the group collectives and
/// CLIP_GRADS (the gradient norm, over every rank).
bool isCollective(Instruction::Kind kind);

/// Whether instructions of `kind` wait on other ranks: the collectives, SEND
/// and RECV.
bool isCommunication(Instruction::Kind kind);

} // namespace piper::plan

#endif // PIPER_PROTO_PLANGROUPS_H
