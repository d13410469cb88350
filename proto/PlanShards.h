// ZeRO shards of parameter state (plan.proto ParamSharding): which elements
// of a parameter a member holds, and how many bytes each piece of its state
// takes. Shared by the memory plan, the validator, the executor and the
// checkpoint writer, so that they never disagree about a range.
#ifndef PIPER_PROTO_PLANSHARDS_H
#define PIPER_PROTO_PLANSHARDS_H

#include <cstdint>
#include <string>
#include <vector>

#include "support/BalancedSplit.h"
#include "proto/plan.pb.h"
#include "support/ParallelLayout.h"

namespace piper::plan {

// shardRange and shardCapacity, the balanced split (support/BalancedSplit.h),
// as plan users name them.
using ::piper::shardCapacity;
using ::piper::ShardRange;
using ::piper::shardRange;

/// Elements of the parameter's tensor (its whole type).
int64_t paramElements(const Parameter &param);

/// Whether piece `kind` of the parameter's state is sharded: 0 value,
/// 1 gradient, 2 and 3 the AdamW moments, 4 the bf16 compute copy (never).
bool stateSharded(const Parameter &param, int kind);

/// Members of the parameter's sharding group (1 when it is not sharded):
/// the data replicas of the class. Under tensor parallelism each member of
/// a tensor-parallel group shards its own slice (or its copy of a whole
/// tensor) over the data replicas of that member, so the group's ranks are
/// T such groups: replica r is member dataReplica(r) of the group of
/// replicas {r mod T, r mod T + T, ...}.
int64_t shardMembers(const Plan &plan, const Parameter &param);
/// Which member of its sharding group replica `replica` is (0 when the
/// parameter is not sharded), and the world ranks of that group in member
/// order.
int64_t shardMember(const Plan &plan, const Parameter &param, int64_t replica);
std::vector<int> shardGroup(const Plan &plan, const Parameter &param,
                            int64_t replica);

/// Elements the buffer of piece `kind` holds: the whole tensor, or the
/// shard capacity (none for the bf16 copy of a ZeRO-3 parameter: kernels
/// read gathered parameters).
int64_t stateElements(const Plan &plan, const Parameter &param, int kind);

/// Expert parallelism (Parameter.expert_members): the members of an
/// expert-parallel group (1 for a whole tensor).
int64_t expertMembers(const Parameter &param);

/// The layout of the plan's class (support/ParallelLayout.h): its ranks
/// are the replicas of one pipeline stage group, dp x cp x tp of them, with
/// `ep` (at least 1) for an expert parameter's groups. Every member index
/// and group below is the layout's.
ParallelLayout layout(const Plan &plan, int64_t ep = 1);

/// Tensor parallelism (TrainingConfig.tensor_parallel, at least 1): the
/// members of a tensor-parallel group, which member replica `replica` is
/// (replica mod tensor_parallel: the replicas of one member hold the same
/// slices), and the data replica it computes with its group (replica /
/// tensor_parallel).
int64_t tensorParallel(const Plan &plan);
int64_t tensorMember(const Plan &plan, int64_t replica);
int64_t dataReplica(const Plan &plan, int64_t replica);
/// Context parallelism (TrainingConfig.context_parallel, at least 1): the
/// members of a context-parallel group, which member replica `replica` is
/// (dataReplica mod context_parallel), and which global batch replica its
/// group reads (dataReplica / context_parallel): the members of one group
/// hold parts of the same sequences. dataReplica stays the gradient replica
/// (ZeRO and gradient sums run over data x context members).
int64_t contextParallel(const Plan &plan);
int64_t contextMember(const Plan &plan, int64_t replica);
int64_t batchReplica(const Plan &plan, int64_t replica);
/// Global microbatches per step: num_replicas / context_parallel batch
/// replicas, num_microbatches each.
int64_t globalMicrobatches(const TrainingConfig &t);
/// The load-balanced causal layout of a sequence of `seqLen` tokens over
/// `members` context members: the sequence is 2N equal chunks and member m
/// holds chunks m and 2N-1-m, in that order. The global position of the
/// member's local token `t` (t < seqLen / members). seqLen must be a
/// multiple of 2N.
int64_t contextPosition(int64_t seqLen, int64_t members, int64_t member,
                        int64_t t);
/// The members of a tensor-parallel slice (Parameter.tensor_slice; 1 when
/// the parameter is not sliced).
int64_t tensorSliceMembers(const Parameter &param);

/// A parameter split over the members of a group, by expert or tensor
/// parallelism: how many members (1 for a whole tensor), the global shape,
/// which member replica `replica` is, and the world ranks of its group, in
/// member order. A tensor-parallel group is T consecutive replicas (member
/// r mod T); an expert-parallel group is G consecutive data replicas of
/// one tensor-parallel member (replica r is data replica d = r / T, member
/// d mod G; without tensor parallelism, r mod G).
int64_t sliceMembers(const Parameter &param);
std::vector<int64_t> globalShape(const Parameter &param);
int64_t sliceMember(const Plan &plan, const Parameter &param, int64_t replica);
std::vector<int> sliceGroup(const Plan &plan, const Parameter &param,
                            int64_t replica);

/// A contiguous run of a member's slice: `count` elements at flat element
/// `global` of the global tensor and `local` of the member's tensor.
struct SliceRun {
  int64_t global = 0;
  int64_t local = 0;
  int64_t count = 0;
  bool operator==(const SliceRun &o) const {
    return global == o.global && local == o.local && count == o.count;
  }
};
/// The runs making up member `member`'s slice of the parameter (0 for a
/// whole tensor), in local order: one run for a whole tensor or an expert
/// block, one per (index before the sliced dimension, part) for a
/// tensor-parallel slice. Adjacent runs are merged.
std::vector<SliceRun> sliceRuns(const Parameter &param, int64_t member);
/// The runs of the `count` elements at flat element `start` of member
/// `member`'s tensor (a ZeRO range of a slice): sliceRuns clipped to the
/// range, `local` counted from `start`.
std::vector<SliceRun> rangeRuns(const Parameter &param, int64_t member,
                                int64_t start, int64_t count);

/// Checks every parameter's sharding: the group exists and lists exactly
/// the plan's ranks in order (member i is replica i), and the pieces are
/// sharded as a ZeRO stage shards them (gradient only with the moments,
/// the value only with the gradient), and expert parameters: their members
/// divide the plan's replicas, and ZeRO does not shard them, and
/// tensor-parallel slices: they match the plan's tensor_parallel and their
/// shape, and are not expert blocks (ZeRO shards a slice over the data
/// replicas of its member). Returns "" or the problem.
std::string checkSharding(const Plan &plan);

} // namespace piper::plan

#endif // PIPER_PROTO_PLANSHARDS_H
