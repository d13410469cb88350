#include "proto/PlanShards.h"

#include <algorithm>

namespace piper::plan {

int64_t paramElements(const Parameter &param) {
  int64_t n = 1;
  for (int64_t d : param.type().shape())
    n *= d;
  return n;
}

bool stateSharded(const Parameter &param, int kind) {
  if (!param.has_sharding())
    return false;
  const ParamSharding &s = param.sharding();
  switch (kind) {
  case 0:
    return s.parameter();
  case 1:
    return s.gradient();
  case 2:
  case 3:
    return s.optimizer();
  default:
    return false;
  }
}

int64_t shardMembers(const Plan &plan, const Parameter &param) {
  if (!param.has_sharding())
    return 1;
  int g = param.sharding().group();
  if (g < 0 || g >= plan.groups_size())
    return 1;
  return std::max<int64_t>(1,
                           plan.groups(g).ranks_size() / tensorParallel(plan));
}

int64_t shardMember(const Plan &plan, const Parameter &param, int64_t replica) {
  return param.has_sharding() ? dataReplica(plan, replica) : 0;
}

std::vector<int> shardGroup(const Plan &plan, const Parameter &param,
                            int64_t replica) {
  std::vector<int> ranks;
  if (!param.has_sharding())
    return ranks;
  int g = param.sharding().group();
  if (g < 0 || g >= plan.groups_size())
    return ranks;
  const DeviceGroup &group = plan.groups(g);
  for (int64_t r : layout(plan).group(Axis::dpcp, replica))
    if (r < group.ranks_size())
      ranks.push_back(group.ranks(static_cast<int>(r)));
  return ranks;
}

int64_t stateElements(const Plan &plan, const Parameter &param, int kind) {
  // ZeRO-3 keeps no bf16 compute copy: kernels read gathered parameters.
  if (kind == 4 && stateSharded(param, 0))
    return 0;
  int64_t n = paramElements(param);
  return stateSharded(param, kind) ? shardCapacity(n, shardMembers(plan, param))
                                   : n;
}

int64_t expertMembers(const Parameter &param) {
  return std::max<int64_t>(1, param.expert_members());
}

int64_t tensorParallel(const Plan &plan) {
  return std::max(1, plan.training().tensor_parallel());
}

ParallelLayout layout(const Plan &plan, int64_t ep) {
  int64_t tp = tensorParallel(plan), cp = contextParallel(plan);
  return ParallelLayout(Degrees{1, plan.ranks_size() / (tp * cp), cp, tp,
                                std::max<int64_t>(1, ep)});
}

int64_t tensorMember(const Plan &plan, int64_t replica) {
  return layout(plan).member(Axis::tp, replica);
}

int64_t dataReplica(const Plan &plan, int64_t replica) {
  return layout(plan).member(Axis::dpcp, replica);
}

int64_t contextParallel(const Plan &plan) {
  return std::max(1, plan.training().context_parallel());
}

int64_t contextMember(const Plan &plan, int64_t replica) {
  return layout(plan).member(Axis::cp, replica);
}

int64_t batchReplica(const Plan &plan, int64_t replica) {
  return layout(plan).member(Axis::dp, replica);
}

int64_t globalMicrobatches(const TrainingConfig &t) {
  return std::max<int64_t>(1, t.num_replicas() /
                                  std::max(1, t.context_parallel())) *
         t.num_microbatches();
}

int64_t contextPosition(int64_t seqLen, int64_t members, int64_t member,
                        int64_t t) {
  if (members <= 1)
    return t;
  int64_t chunk = seqLen / (2 * members);
  return t < chunk ? member * chunk + t
                   : (2 * members - 1 - member) * chunk + (t - chunk);
}

int64_t tensorSliceMembers(const Parameter &param) {
  return param.has_tensor_slice() ? std::max(1, param.tensor_slice().members())
                                  : 1;
}

int64_t sliceMembers(const Parameter &param) {
  return std::max(expertMembers(param), tensorSliceMembers(param));
}

std::vector<int64_t> globalShape(const Parameter &param) {
  std::vector<int64_t> shape(param.type().shape().begin(),
                             param.type().shape().end());
  if (shape.empty())
    return shape;
  if (expertMembers(param) >= 2)
    shape[0] *= expertMembers(param);
  int dim = param.tensor_slice().dim();
  if (tensorSliceMembers(param) >= 2 && dim >= 0 &&
      dim < static_cast<int>(shape.size()))
    shape[dim] *= tensorSliceMembers(param);
  return shape;
}

int64_t sliceMember(const Plan &plan, const Parameter &param, int64_t replica) {
  return layout(plan, expertMembers(param))
      .member(tensorSliceMembers(param) >= 2 ? Axis::tp : Axis::ep, replica);
}

std::vector<int> sliceGroup(const Plan &plan, const Parameter &param,
                            int64_t replica) {
  ParallelLayout l = layout(plan, expertMembers(param));
  std::vector<int64_t> members =
      l.group(tensorSliceMembers(param) >= 2 ? Axis::tp : Axis::ep, replica);
  std::vector<int> ranks;
  for (int64_t r : members)
    if (r < plan.ranks_size())
      ranks.push_back(plan.ranks(static_cast<int>(r)));
  return ranks;
}

std::vector<SliceRun> sliceRuns(const Parameter &param, int64_t member) {
  int64_t elements = paramElements(param);
  if (tensorSliceMembers(param) < 2)
    return {SliceRun{(member % expertMembers(param)) * elements, 0, elements}};
  const TensorSlice &ts = param.tensor_slice();
  int64_t members = tensorSliceMembers(param), m = member % members;
  std::vector<int64_t> global = globalShape(param);
  int dim = ts.dim();
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d)
    outer *= global[d];
  for (size_t d = dim + 1; d < global.size(); ++d)
    inner *= global[d];
  std::vector<int64_t> parts(ts.parts().begin(), ts.parts().end());
  if (parts.empty())
    parts.push_back(global[dim]);
  int64_t localExtent = global[dim] / members;
  std::vector<SliceRun> runs;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t partStart = 0, localStart = 0;
    for (int64_t part : parts) {
      int64_t block = part / members;
      SliceRun run{(o * global[dim] + partStart + m * block) * inner,
                   (o * localExtent + localStart) * inner, block * inner};
      if (!runs.empty() &&
          runs.back().global + runs.back().count == run.global &&
          runs.back().local + runs.back().count == run.local)
        runs.back().count += run.count;
      else if (run.count > 0)
        runs.push_back(run);
      partStart += part;
      localStart += block;
    }
  }
  return runs;
}

std::vector<SliceRun> rangeRuns(const Parameter &param, int64_t member,
                                int64_t start, int64_t count) {
  std::vector<SliceRun> runs;
  for (const SliceRun &run : sliceRuns(param, member)) {
    int64_t from = std::max(run.local, start),
            to = std::min(run.local + run.count, start + count);
    if (from < to)
      runs.push_back(
          SliceRun{run.global + (from - run.local), from - start, to - from});
  }
  return runs;
}

/// Why the tensor-parallel slice of `p` does not fit the plan, or "".
static std::string checkTensorSlice(const Plan &plan, const Parameter &p) {
  if (!p.has_tensor_slice())
    return "";
  const TensorSlice &ts = p.tensor_slice();
  std::string who = "parameter '" + p.name() + "': tensor_slice ";
  if (ts.members() < 2 || ts.members() != tensorParallel(plan))
    return who + "has " + std::to_string(ts.members()) +
           " members, but the plan's tensor_parallel is " +
           std::to_string(tensorParallel(plan));
  if (ts.dim() < 0 || ts.dim() >= p.type().shape_size())
    return who + "dim " + std::to_string(ts.dim()) +
           " is not a dimension of its type";
  if (p.expert_members() > 1)
    return who + "cannot be combined with expert blocks";
  int64_t global = p.type().shape(ts.dim()) * ts.members(), sum = 0;
  for (int64_t part : ts.parts()) {
    if (part <= 0 || part % ts.members() != 0)
      return who + "part " + std::to_string(part) +
             " is not a positive multiple of the members";
    sum += part;
  }
  if (ts.parts_size() > 0 && sum != global)
    return who + "parts sum to " + std::to_string(sum) +
           ", not the global extent " + std::to_string(global);
  return "";
}

std::string checkSharding(const Plan &plan) {
  for (const Parameter &p : plan.params())
    if (std::string err = checkTensorSlice(plan, p); !err.empty())
      return err;
  for (const Parameter &p : plan.params()) {
    if (p.expert_members() < 0 || p.expert_members() > 1) {
      std::string who = "parameter '" + p.name() + "': ";
      if (p.expert_members() < 0)
        return who + "negative expert_members";
      int64_t data = plan.ranks_size() / tensorParallel(plan);
      if (data % p.expert_members() != 0)
        return who + "expert_members " + std::to_string(p.expert_members()) +
               " does not divide the plan's " + std::to_string(data) +
               " data replicas";
      if (p.type().shape_size() == 0)
        return who + "an expert parameter needs a first dimension";
      if (p.has_sharding())
        return who + "an expert parameter cannot also be ZeRO-sharded";
      if (!std::is_sorted(plan.ranks().begin(), plan.ranks().end()))
        return who + "expert-parallel groups need the plan's ranks in "
                     "increasing order";
    }
  }
  for (const Parameter &p : plan.params()) {
    if (!p.has_sharding())
      continue;
    const ParamSharding &s = p.sharding();
    std::string who = "parameter '" + p.name() + "': sharding ";
    if (s.group() < 0 || s.group() >= plan.groups_size())
      return who + "group " + std::to_string(s.group()) +
             " is out of range (the plan has " +
             std::to_string(plan.groups_size()) + " groups)";
    const DeviceGroup &g = plan.groups(s.group());
    if (!std::equal(g.ranks().begin(), g.ranks().end(), plan.ranks().begin(),
                    plan.ranks().end()))
      return who + "group " + std::to_string(s.group()) +
             " is not the plan's ranks (a shard group is the data-parallel "
             "replicas of the class, in order)";
    if (g.ranks_size() % tensorParallel(plan) != 0)
      return who + "group " + std::to_string(s.group()) + " has " +
             std::to_string(g.ranks_size()) +
             " ranks, not whole tensor-parallel groups of " +
             std::to_string(tensorParallel(plan));
    if (!std::is_sorted(g.ranks().begin(), g.ranks().end()) ||
        std::adjacent_find(g.ranks().begin(), g.ranks().end()) !=
            g.ranks().end())
      return who + "group " + std::to_string(s.group()) +
             " does not list its ranks in increasing order";
    if (!s.optimizer())
      return who + "shards nothing, or not the optimizer state (ZeRO shards "
                   "the AdamW moments first)";
    if (s.parameter() && !s.gradient())
      return who + "shards the value but not the gradient";
  }
  return "";
}

} // namespace piper::plan
