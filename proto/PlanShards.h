// ZeRO shards of parameter state (plan.proto ParamSharding): which elements
// of a parameter a member holds, and how many bytes each piece of its state
// takes. Shared by the memory plan, the validator, the executor and the
// checkpoint writer, so that they never disagree about a range.
#ifndef PIPER_PROTO_PLANSHARDS_H
#define PIPER_PROTO_PLANSHARDS_H

#include <cstdint>
#include <string>

#include "proto/plan.pb.h"

namespace piper::plan {

/// The consecutive elements [start, start + count) of a flattened tensor of
/// `elements` that member `index` of `members` holds: elements / members,
/// plus one for the first elements % members members.
struct ShardRange {
  int64_t start = 0;
  int64_t count = 0;
};
ShardRange shardRange(int64_t elements, int64_t members, int64_t index);

/// Elements of a shard buffer: the largest range, ceil(elements / members).
int64_t shardCapacity(int64_t elements, int64_t members);

/// Elements of the parameter's tensor (its whole type).
int64_t paramElements(const Parameter &param);

/// Whether piece `kind` of the parameter's state is sharded: 0 value,
/// 1 gradient, 2 and 3 the AdamW moments, 4 the bf16 compute copy (never).
bool stateSharded(const Parameter &param, int kind);

/// Members of the parameter's sharding group (1 when it is not sharded).
int64_t shardMembers(const Plan &plan, const Parameter &param);

/// Elements the buffer of piece `kind` holds: the whole tensor, or the
/// shard capacity (none for the bf16 copy of a ZeRO-3 parameter: kernels
/// read gathered parameters).
int64_t stateElements(const Plan &plan, const Parameter &param, int kind);

/// Checks every parameter's sharding: the group exists and lists exactly
/// the plan's ranks in order (member i is replica i), and the pieces are
/// sharded as a ZeRO stage shards them (gradient only with the moments,
/// the value only with the gradient). Returns "" or the problem.
std::string checkSharding(const Plan &plan);

} // namespace piper::plan

#endif // PIPER_PROTO_PLANSHARDS_H
